typedef void (*binder)(void*, const char*, void*);
extern void* sbx_make_module(const char*, int, const char* const*, void* const*, const binder*);
extern void sbx_bind_T_T(void*, const char*, void*);
extern void* sbx_fn_0(void);
__attribute__((visibility("default"))) void* PyInit_sbx_sigmoid(void) {
  static const char* names[] = {"sigmoid_forward"};
  static const binder b[] = {sbx_bind_T_T};
  void* fns[1];
  fns[0] = sbx_fn_0();
  return sbx_make_module("sbx_sigmoid", 1, names, fns, b);
}
