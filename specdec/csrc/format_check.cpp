// specdec: a canary compiled into every specdec extension, called once after each build.
//
// Why: an extension linked with a private copy of libstdc++ (a relocated GCC that links it
// statically, or `-static-libstdc++`) exports that copy's symbols, while torch has already
// loaded the system libstdc++.so.6. Two copies meet in one process, and formatting an
// integer into a TORCH_CHECK message (the std::num_put locale facet) then crashes the
// process (SIGSEGV, seen on a CUDA machine) or silently drops the number (seen here).
// Formatting a dtype or a string works either way, so only a check that formats numbers
// finds it. specdec.native links with `-Wl,--exclude-libs,ALL` so no private copy is
// exported, and calls this function in a child process after every build: a build that
// cannot name a bad value in its error messages is refused before any user input meets it.
//
// The function is extern "C" so the checker reaches it with ctypes, whatever the module's
// Python bindings look like.

#include <c10/util/Exception.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <cstring>

extern "C" __attribute__((visibility("default"))) int specdec_format_check(int64_t value, char* out,
                                                                           int64_t out_len) {
  // Formats `value` and the shape [value, 3] into a failing check; copies its message to out.
  // Returns 1 when the check raised (the message is in out), 0 when it did not raise.
  const int64_t dims[2] = {value, 3};
  try {
    TORCH_CHECK(false, "format check: value ", value, ", shape ", c10::IntArrayRef(dims, 2));
  } catch (const c10::Error& error) {
    if (out != nullptr && out_len > 0) {
      std::strncpy(out, error.what_without_backtrace(), static_cast<size_t>(out_len - 1));
      out[out_len - 1] = '\0';
    }
    return 1;
  }
  return 0;
}
