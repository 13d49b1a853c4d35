#include "progress_display.h"

#include <unistd.h>

namespace cuda_criu::cli {

ProgressDisplay::ProgressDisplay(std::FILE *out) : out_(out), in_place_(isatty(fileno(out)) == 1) {}

void ProgressDisplay::show(const std::string &line)
{
	if (in_place_)
		std::fprintf(out_, "\r%s\033[K", line.c_str()); // \033[K: clears what a longer line left
	else
		std::fprintf(out_, "%s\n", line.c_str());
	std::fflush(out_);
	shown_ = true;
}

void ProgressDisplay::finish()
{
	if (in_place_ && shown_) {
		std::fputs("\r\033[K", out_);
		std::fflush(out_);
	}
	shown_ = false;
}

} // namespace cuda_criu::cli
