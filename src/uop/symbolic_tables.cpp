// Symbolic rule groups live here (see symbolic.cpp).
