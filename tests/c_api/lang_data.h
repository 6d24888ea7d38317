/* SPDX-License-Identifier: BSD-3-Clause */
/* The batches every language's same-bits program trains on (tests/fortran/lang_bits.f90 computes
 * the same values): integer arithmetic and one float division, exact in C, C++ and Fortran. Sample
 * b of step s on rank r: input element i (0..7) and target element j (0..2). */
#ifndef DTRAIN_TESTS_LANG_DATA_H
#define DTRAIN_TESTS_LANG_DATA_H

enum { LANG_IN = 8, LANG_OUT = 3, LANG_BATCH = 4, LANG_STEPS = 5 };

static inline float lang_x(int r, int s, int b, int i) {
  return (float)((r * 7919 + s * 131 + b * 17 + i * 3) % 97 - 48) / 48.0f;
}
static inline float lang_t(int r, int s, int b, int j) {
  return (float)((r * 7919 + s * 131 + b * 17 + j * 5 + 1) % 89 - 44) / 44.0f;
}

#endif
