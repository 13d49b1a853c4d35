// Result<T>: the one way expected failures travel in this project (GCC 12 has no std::expected).
// An Error carries a positive errno (a failed driver call is EIO, or ETIMEDOUT, with the CUDA code in
// its text) and a message that grows context as it moves up: "checkpoint pid 4242:
// cuCheckpointProcessCheckpoint failed: CUDA_ERROR_ILLEGAL_STATE (401): ...". Reading the value of a
// failed Result is a bug (std::bad_variant_access): check ok() first; tests ASSERT it, with the error.
#pragma once

#include <cerrno>
#include <string>
#include <utility>
#include <variant>

#include "base/format.h"

namespace cuda_criu {

class Error {
public:
	// errno_value: positive errno describing the failure class (EIO for driver errors).
	Error(int errno_value, std::string message) : errno_(errno_value), message_(std::move(message)) {}

	int errno_value() const { return errno_; }
	const std::string &message() const { return message_; }

	// Prefixes context: Error(EIO, "x").context("lock pid %d", 7) -> "lock pid 7: x".
	Error context(const char *fmt, ...) && __attribute__((format(printf, 2, 3)));

private:
	int errno_;
	std::string message_;
};

Error make_error(int errno_value, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Error from the current errno: "open /proc/1/maps: No such file or directory".
Error errno_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

template <typename T>
class [[nodiscard]] Result {
public:
	Result(T value) : v_(std::move(value)) {}
	Result(Error error) : v_(std::move(error)) {}

	bool ok() const { return v_.index() == 0; }
	explicit operator bool() const { return ok(); }

	T &value() & { return std::get<0>(v_); }
	const T &value() const & { return std::get<0>(v_); }
	T &&value() && { return std::get<0>(std::move(v_)); }
	T &operator*() & { return value(); }
	const T &operator*() const & { return value(); }
	T *operator->() { return &value(); }
	const T *operator->() const { return &value(); }

	const Error &error() const & { return std::get<1>(v_); }
	Error &&error() && { return std::get<1>(std::move(v_)); }

private:
	std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
public:
	Result() = default;
	Result(Error error) : error_(std::move(error)), failed_(true) {}

	bool ok() const { return !failed_; }
	explicit operator bool() const { return ok(); }
	const Error &error() const & { return error_; }
	Error &&error() && { return std::move(error_); }

private:
	Error error_{0, {}};
	bool failed_ = false;
};

using Status = Result<void>;

} // namespace cuda_criu
