/* assert: the always-on assertion of every module (kernels included, which use no GLib).
 * Programmer errors (broken invariants) abort with the condition, file and line in every build;
 * NDEBUG does not remove them.
 *
 *   unsigned k = 2, n_experts = 8;
 *   PIPER_ASSERT(k >= 1 && k <= n_experts);
 */
#ifndef PIPER_BASE_ASSERT_H
#define PIPER_BASE_ASSERT_H

#define PIPER_ASSERT(cond)                                                                       \
  ((cond) ? (void)0 : piper_assert_fail(#cond, __FILE__, __LINE__, __func__))
#define PIPER_UNREACHABLE() piper_assert_fail("unreachable", __FILE__, __LINE__, __func__)
_Noreturn void piper_assert_fail(const char *cond, const char *file, int line, const char *func);

#endif
