#pragma once
// The first include of every public tg header: refuses compilers below C++20 with one clear line.
#if __cplusplus < 202002L
#error "tg needs C++20: compile with -std=c++20 (pkg-config --cflags tg, CMake's tg::tg and Meson's dependency('tg') carry it)"
// A missing include is fatal: compilation stops here instead of printing dozens of errors from the headers below.
#include "tg: stopping, the compiler is not in C++20 mode"
#endif
