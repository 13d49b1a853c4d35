// Where cuda-criu shows the progress of a long driver call or CRIU run: on a terminal one line on stderr
// rewritten in place, otherwise (a log, a pipe) each line on its own, so that nothing is lost there.
#pragma once

#include <cstdio>
#include <string>

namespace cuda_criu::cli {

class ProgressDisplay {
public:
	// out: where the lines go; a terminal there gets the line rewritten in place.
	explicit ProgressDisplay(std::FILE *out = stderr);
	~ProgressDisplay() { finish(); }
	ProgressDisplay(const ProgressDisplay &) = delete;
	ProgressDisplay &operator=(const ProgressDisplay &) = delete;

	// Shows line ("cuda-criu: checkpoint: 1.2 of 4.0 GiB (...)") in place of the one shown before.
	void show(const std::string &line);
	// Erases the line shown in place, so that what the program prints next starts on a clean line.
	void finish();
	bool in_place() const { return in_place_; }

private:
	std::FILE *out_;
	bool in_place_;
	bool shown_ = false;
};

} // namespace cuda_criu::cli
