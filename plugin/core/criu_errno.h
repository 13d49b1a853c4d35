// The errno a failing hook hands CRIU. CRIU reads -ENOTSUP from a device hook as "not my process" and
// goes on as if the plugin had nothing to do: a failure that carried ENOTSUP (or EOPNOTSUPP, the same
// value on Linux) would turn a failed restore into one that "succeeds" without the GPU state. Only the
// ABI layer's own "not mine" answer returns -ENOTSUP.
#pragma once

#include <cerrno>

#include "base/result.h"

namespace cuda_criu {

// A positive errno for a failure: never ENOTSUP/EOPNOTSUPP, never 0.
inline int failure_errno(const Error &e)
{
	int v = e.errno_value();
	if (v <= 0 || v == ENOTSUP || v == EOPNOTSUPP)
		return EIO;
	return v;
}

} // namespace cuda_criu
