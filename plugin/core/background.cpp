#include "core/background.h"

#include <chrono>
#include <thread>

#include "os/fs_context.h"

namespace cuda_criu {

std::shared_ptr<Background> Background::start(std::function<void()> own_fs, std::function<void()> work,
						 unsigned own_fs_wait_ms)
{
	auto w = std::make_shared<Background>();
	own_thread([w, own_fs = std::move(own_fs), work = std::move(work)] {
		own_fs();
		{
			std::lock_guard<std::mutex> g(w->mu_);
			w->own_fs_ = true;
			w->cv_.notify_all();
		}
		work();
		std::lock_guard<std::mutex> g(w->mu_);
		w->done_ = true;
		w->cv_.notify_all();
	}).detach();
	std::unique_lock<std::mutex> g(w->mu_);
	w->cv_.wait_for(g, std::chrono::milliseconds(own_fs_wait_ms), [&] { return w->own_fs_; });
	return w;
}

bool Background::wait(unsigned timeout_ms)
{
	std::unique_lock<std::mutex> g(mu_);
	if (!given_up_ && !cv_.wait_for(g, std::chrono::milliseconds(timeout_ms), [this] { return done_; }))
		given_up_ = true;
	return done_;
}

bool Background::done_within(unsigned timeout_ms)
{
	std::unique_lock<std::mutex> g(mu_);
	return cv_.wait_for(g, std::chrono::milliseconds(timeout_ms), [this] { return done_; });
}

} // namespace cuda_criu
