// Compile-fail test (see check.sh / meson.build in this folder): compiled with -std=c++17 the umbrella header
// must stop at tg/config.hpp's one-line #error; compiled as C++20 (the project's flags) it must compile.
#include "tg/tg.hpp"

int main() { return tg::Tensor::ones({2}).ndim() == 1 ? 0 : 1; }
