#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/inherited_devices.h"
#include "expect_result.h"
#include "fakes.h"
#include "image/devices_image.h"
#include "os/nvidia_files.h"
#include "os/unique_fd.h"

namespace cuda_criu {
namespace {

Status allow_all(pid_t) { return {}; }

struct TempDir {
	std::string path;
	UniqueFd fd;
	TempDir()
	{
		char tmpl[] = "/tmp/inherited-test.XXXXXX";
		path = mkdtemp(tmpl);
		fd = UniqueFd(open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
	}
	~TempDir() { std::system(("rm -rf " + path).c_str()); }
};

int flags_of(int fd) { return fcntl(fd, F_GETFL); }

TEST(DevicesImage, RoundTripAndRejectsDamage)
{
	InheritedDevicesRecord r;
	r.mapped_paths = {"/dev/nvidiactl", "/dev/nvidia0"};
	r.files.push_back({0x11, O_RDWR, "/dev/nvidiactl"});
	r.files.push_back({0x2a, O_WRONLY | O_NONBLOCK, "/dev/nvidia-uvm"});
	auto bytes = encode_devices_image(r);
	auto back = decode_devices_image(bytes.data(), bytes.size());
	ASSERT_TRUE(back) << back.error().message();
	EXPECT_EQ(back->mapped_paths, r.mapped_paths);
	ASSERT_EQ(back->files.size(), 2u);
	EXPECT_EQ(back->files[1].id, 0x2au);
	EXPECT_EQ(back->files[1].flags, static_cast<uint32_t>(O_WRONLY | O_NONBLOCK));
	EXPECT_EQ(back->files[1].path, "/dev/nvidia-uvm");

	EXPECT_FALSE(decode_devices_image(bytes.data(), bytes.size() - 1));
	bytes[0] = 'X';
	auto bad = decode_devices_image(bytes.data(), bytes.size());
	ASSERT_FALSE(bad);
	EXPECT_NE(bad.error().message().find("bad magic"), std::string::npos);
}

TEST(DevicesImage, ProcessesRoundTrip)
{
	InheritedDevicesRecord r;
	r.mapped_paths = {"/dev/nvidiactl"};
	InheritedProcessRecord p;
	p.pid = 4242;
	p.ns_pid = 7;
	p.mappings.push_back({0x200600000, 0x200800000, 0, "rw-s", "/dev/nvidiactl"});
	p.mappings.push_back({0x7f0000000000, 0x7f0000001000, 0x1000, "r--s", "/dev/nvidia0"});
	p.fds.push_back({5, O_RDWR | O_CLOEXEC, "/dev/nvidiactl"});
	r.processes.push_back(p);
	r.processes.push_back({4243, 0, {}, {{9, O_RDONLY, "/dev/nvidia-uvm"}}});
	auto bytes = encode_devices_image(r);
	auto back = decode_devices_image(bytes.data(), bytes.size());
	ASSERT_TRUE(back) << back.error().message();
	ASSERT_EQ(back->processes.size(), 2u);
	const InheritedProcessRecord &a = back->processes[0];
	EXPECT_EQ(a.pid, 4242);
	EXPECT_EQ(a.ns_pid, 7);
	ASSERT_EQ(a.mappings.size(), 2u);
	EXPECT_EQ(a.mappings[1].start, 0x7f0000000000u);
	EXPECT_EQ(a.mappings[1].end, 0x7f0000001000u);
	EXPECT_EQ(a.mappings[1].offset, 0x1000u);
	EXPECT_EQ(a.mappings[1].perms, "r--s");
	EXPECT_EQ(a.mappings[1].path, "/dev/nvidia0");
	ASSERT_EQ(a.fds.size(), 1u);
	EXPECT_EQ(a.fds[0].fd, 5);
	EXPECT_EQ(a.fds[0].flags, static_cast<uint32_t>(O_RDWR | O_CLOEXEC));
	const InheritedProcessRecord &b = back->processes[1];
	EXPECT_EQ(b.pid, 4243);
	EXPECT_EQ(b.ns_pid, 0);
	EXPECT_TRUE(b.mappings.empty());
	ASSERT_EQ(b.fds.size(), 1u);
	EXPECT_EQ(b.fds[0].path, "/dev/nvidia-uvm");
}

TEST(NvidiaFiles, OrdinaryFilesAreNotClaimed)
{
	unsetenv("FAKEGPU_DIR");
	TempDir dir;
	SystemHost host;
	for (const char *path : {"/dev/null", "/dev/zero", "/proc/self/status"}) {
		UniqueFd fd(open(path, O_RDONLY | O_CLOEXEC));
		ASSERT_TRUE(fd.valid()) << path;
		struct stat st;
		ASSERT_EQ(fstat(fd.get(), &st), 0);
		EXPECT_FALSE(is_nvidia_device_file(fd.get(), st)) << path;
	}
	// A regular file named like a device node is not one.
	std::string fake = dir.path + "/nvidia0";
	UniqueFd fd(open(fake.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
	struct stat st;
	ASSERT_EQ(fstat(fd.get(), &st), 0);
	EXPECT_FALSE(is_nvidia_device_file(fd.get(), st));
	InheritedDevicesDump dump(host, dir.fd.get(), allow_all);
	auto r = dump.claim_file(fd.get(), 7);
	ASSERT_TRUE(r);
	EXPECT_TRUE(is_false(r));
	EXPECT_FALSE(dump.claimed_any());
	EXPECT_NE(faccessat(dir.fd.get(), kDevicesImageFileName, F_OK, 0), 0); // nothing written
}

// The test seam: a device node under $FAKEGPU_DIR/dev/ counts; needs mknod (root).
TEST(NvidiaFiles, FakeDeviceNodeIsClaimedAndRestoredAsPlaceholders)
{
	TempDir dir;
	SystemHost host;
	std::string devdir = dir.path + "/dev", node = devdir + "/nvidia-mappable";
	ASSERT_EQ(mkdir(devdir.c_str(), 0755), 0);
	if (mknod(node.c_str(), S_IFCHR | 0600, makedev(1, 3)) != 0) // the rdev of /dev/null
		GTEST_SKIP() << "mknod: " << strerror(errno);
	UniqueFd fd(open(node.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC));
	ASSERT_TRUE(fd.valid());
	struct stat st;
	ASSERT_EQ(fstat(fd.get(), &st), 0);
	unsetenv("FAKEGPU_DIR");
	EXPECT_FALSE(is_nvidia_device_file(fd.get(), st)); // no seam in production
	EXPECT_TRUE(nvidia_device_fds(getpid()).empty());
	setenv("FAKEGPU_DIR", dir.path.c_str(), 1);
	EXPECT_TRUE(is_nvidia_device_file(fd.get(), st));
	// What inspect records of a process: this one holds the node open.
	auto held = nvidia_device_fds(getpid());
	ASSERT_EQ(held.size(), 1u);
	EXPECT_EQ(held[0].fd, fd.get());
	EXPECT_EQ(held[0].path, node);
	EXPECT_EQ(held[0].flags & (O_ACCMODE | O_NONBLOCK | O_CLOEXEC), unsigned(O_WRONLY | O_NONBLOCK | O_CLOEXEC));

	InheritedDevicesDump dump(host, dir.fd.get(), allow_all);
	auto m = dump.claim_mapping(fd.get(), st);
	ASSERT_TRUE(m) << m.error().message();
	EXPECT_TRUE(is_true(m));
	auto f = dump.claim_file(fd.get(), 0x33);
	ASSERT_TRUE(f) << f.error().message();
	EXPECT_TRUE(is_true(f));
	unsetenv("FAKEGPU_DIR");

	InheritedDevicesRestore restore(dir.fd.get());
	ASSERT_TRUE(restore.load());
	auto mfd = restore.mapping_fd(node.c_str());
	ASSERT_TRUE(mfd);
	ASSERT_TRUE(mfd->has_value());
	UniqueFd zero(**mfd);
	ASSERT_EQ(fstat(zero.get(), &st), 0);
	EXPECT_EQ(st.st_rdev, makedev(1, 5)); // /dev/zero
	EXPECT_EQ(flags_of(zero.get()) & O_ACCMODE, O_RDWR);
	auto moved = restore.mapping_fd("/dev/nvidia-mappable"); // the same node seen through other mounts
	ASSERT_TRUE(moved);
	ASSERT_TRUE(moved->has_value());
	close(**moved);
	auto none = restore.mapping_fd("/dev/other");
	ASSERT_TRUE(none);
	EXPECT_FALSE(none->has_value());

	auto ffd = restore.file_fd(0x33);
	ASSERT_TRUE(ffd);
	ASSERT_TRUE(ffd->has_value());
	UniqueFd null(**ffd);
	EXPECT_EQ(flags_of(null.get()) & (O_ACCMODE | O_NONBLOCK), O_WRONLY | O_NONBLOCK);
	ASSERT_EQ(fstat(null.get(), &st), 0);
	EXPECT_EQ(st.st_rdev, makedev(1, 3)); // /dev/null
	auto other = restore.file_fd(0x34);
	ASSERT_TRUE(other);
	EXPECT_FALSE(other->has_value());
}

// Through the host: a claim records what each process CRIU seized holds; a checkpointed process that
// still maps a device file is refused.
TEST(InheritedDevicesDump, RecordsWhatTheHostSaysEachSeizedProcessHolds)
{
	TempDir dir;
	testing::FakeHost host;
	UniqueFd fd(open("/dev/null", O_RDWR | O_CLOEXEC));
	host.device_fds.insert(fd.get());
	host.fd_paths[fd.get()] = "/dev/nvidiactl";
	host.traced = {40, 41};
	host.held[40] = {4, {{0x1000, 0x2000, 0, "rw-s", "/dev/nvidia0"}}, {{5, O_RDWR, "/dev/nvidiactl"}}};
	InheritedDevicesDump dump(host, dir.fd.get(), allow_all);
	auto r = dump.claim_file(fd.get(), 9);
	ASSERT_TRUE(r) << r.error().message();
	EXPECT_TRUE(is_true(r));
	auto back = read_devices_image(dir.fd.get());
	ASSERT_TRUE(back && *back);
	const InheritedDevicesRecord &rec = **back;
	ASSERT_EQ(rec.files.size(), 1u);
	EXPECT_EQ(rec.files[0].path, "/dev/nvidiactl");
	EXPECT_EQ(rec.files[0].flags & O_ACCMODE, unsigned(O_RDWR));
	ASSERT_EQ(rec.processes.size(), 1u); // 41 holds nothing
	EXPECT_EQ(rec.processes[0].pid, 40);
	EXPECT_EQ(rec.processes[0].ns_pid, 4);
	ASSERT_EQ(rec.processes[0].mappings.size(), 1u);
	EXPECT_EQ(rec.processes[0].mappings[0].path, "/dev/nvidia0");
	ASSERT_EQ(rec.processes[0].fds.size(), 1u);

	EXPECT_TRUE(check_no_device_mappings(host, 40).ok());
	host.device_mappings[40] = {0x7000};
	auto st = check_no_device_mappings(host, 40);
	ASSERT_FALSE(st.ok());
	EXPECT_EQ(st.error().errno_value(), EBUSY);
}

// A holder the check refuses fails the claim, and every later one, naming it; nothing is recorded.
TEST(InheritedDevicesDump, RefusedHolderFailsEveryClaim)
{
	TempDir dir;
	testing::FakeHost host;
	UniqueFd fd(open("/dev/null", O_RDWR | O_CLOEXEC));
	host.device_fds.insert(fd.get());
	host.traced = {40, 41};
	host.held[41] = {41, {}, {{5, O_RDWR, "/dev/nvidiactl"}}};
	std::vector<pid_t> asked;
	InheritedDevicesDump dump(host, dir.fd.get(), [&asked](pid_t pid) -> Status {
		asked.push_back(pid);
		return make_error(EBUSY, "pid %d holds NVIDIA device files but does not use CUDA", pid);
	});
	for (int round = 0; round < 2; round++) {
		auto r = round ? dump.claim_file(fd.get(), 9) : dump.claim_mapping(fd.get(), {});
		ASSERT_FALSE(r);
		EXPECT_NE(r.error().message().find("pid 41 holds NVIDIA device files but does not use CUDA"),
			  std::string::npos)
			<< r.error().message();
		EXPECT_NE(r.error().message().find("the dump is refused"), std::string::npos);
	}
	EXPECT_EQ(asked, std::vector<pid_t>{41}); // 40 holds nothing; asked once
	EXPECT_FALSE(dump.claimed_any());
	EXPECT_NE(faccessat(dir.fd.get(), kDevicesImageFileName, F_OK, 0), 0);
}

TEST(InheritedDevicesRestore, NoImageMeansNothingIsOurs)
{
	TempDir dir;
	InheritedDevicesRestore restore(dir.fd.get());
	ASSERT_TRUE(restore.load());
	auto f = restore.file_fd(1);
	ASSERT_TRUE(f);
	EXPECT_FALSE(f->has_value());
}

} // namespace
} // namespace cuda_criu
