// Test predicates for a Result whose value is tested as a bool: EXPECT_TRUE(is_true(s.pause(10))) fails
// with the Result's error rather than throwing std::bad_variant_access on a failed Result.
#pragma once

#include <gtest/gtest.h>

#include "base/result.h"

namespace cuda_criu {

template <typename T>
::testing::AssertionResult result_is(const Result<T> &r, bool want)
{
	if (!r.ok())
		return ::testing::AssertionFailure() << "failed: " << r.error().message();
	if (static_cast<bool>(*r) != want)
		return ::testing::AssertionFailure() << "ok, but " << (want ? "false" : "true");
	return ::testing::AssertionSuccess();
}

template <typename T>
::testing::AssertionResult is_true(const Result<T> &r)
{
	return result_is(r, true);
}

template <typename T>
::testing::AssertionResult is_false(const Result<T> &r)
{
	return result_is(r, false);
}

} // namespace cuda_criu
