#include <torch/extension.h>
// trusted, once per pool: the module object of a split build
extern "C" PyObject* sbx_make_module(const char* name, int n, const char* const* names, void* const* fns,
                                     void (*const* binders)(void*, const char*, void*)) {
  static PyModuleDef def;
  try {
    auto m = pybind11::module_::create_extension_module(name, nullptr, &def);
    for (int i = 0; i < n; ++i) binders[i](&m, names[i], fns[i]);
    return m.release().ptr();
  } catch (pybind11::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ImportError, e.what());
    return nullptr;
  }
}
