#include <torch/extension.h>
// trusted, once per signature: what torch's PYBIND11_MODULE block does for one function
extern "C" void sbx_bind_T_T(void* m, const char* name, void* fn) {
  using Fn = at::Tensor (*)(at::Tensor);
  static_cast<pybind11::module_*>(m)->def(name, torch::wrap_pybind_function(reinterpret_cast<Fn>(fn)), name);
}
