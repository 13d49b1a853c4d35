#include <gtest/gtest.h>

#include <algorithm>
#include <utility>

#include "core/gpu_plan.h"

namespace cuda_criu {
namespace {

GpuInfo gpu(int ordinal, uint8_t id, const char *name, uint64_t mem = 80ULL << 30)
{
	GpuInfo g;
	g.ordinal = ordinal;
	g.uuid.bytes[15] = id;
	g.name = name;
	g.memory_bytes = mem;
	return g;
}

GpuRecord rec(const GpuInfo &g) { return {g.uuid, g.name, g.memory_bytes, "", g.ordinal}; }

// The plan with the map as the user writes it (parsed as the plugin's option is).
Result<GpuPlan> plan_gpus(const ImageRecord &image, const std::vector<GpuInfo> &here, const std::vector<GpuInfo> &machine,
			  const std::string &map)
{
	auto parsed = DeviceMap::parse(map);
	if (!parsed)
		return std::move(parsed).error();
	return cuda_criu::plan_gpus(image, here, machine, *parsed);
}

// An image of processes on the given GPUs (one process per GPU, `bytes` of state each).
ImageRecord image_on(std::vector<GpuInfo> gpus, uint64_t bytes = 1ULL << 30)
{
	ImageRecord r;
	int pid = 100;
	for (const GpuInfo &g : gpus) {
		r.gpus.push_back(rec(g));
		r.processes.push_back({pid, pid, CudaState::Running, {g.uuid}, bytes, 0, 0});
		pid++;
	}
	return r;
}

// pairs are want's (from, to), in this order, or with any_order in any order; told as UUIDs.
void expect_pairs(const std::vector<GpuPair> &pairs, const std::vector<std::pair<GpuInfo, GpuInfo>> &want,
		  bool any_order = false)
{
	std::vector<std::string> got_text, want_text;
	for (const GpuPair &p : pairs)
		got_text.push_back(p.from.str() + " -> " + p.to.str());
	for (const auto &[from, to] : want)
		want_text.push_back(from.uuid.str() + " -> " + to.uuid.str());
	if (any_order) {
		std::sort(got_text.begin(), got_text.end());
		std::sort(want_text.begin(), want_text.end());
	}
	EXPECT_EQ(got_text, want_text);
}

const GpuInfo A0 = gpu(0, 0xa0, "NVIDIA H200"), A1 = gpu(1, 0xa1, "NVIDIA H200"), A2 = gpu(2, 0xa2, "NVIDIA H200");
const GpuInfo B0 = gpu(0, 0xb0, "NVIDIA H200"), B1 = gpu(1, 0xb1, "NVIDIA H200");
const GpuInfo C0 = gpu(0, 0xc0, "NVIDIA A100");

TEST(GpuPlan, SameGpusNeedNoPairs)
{
	auto p = plan_gpus(image_on({A0, A1}), {A0, A1}, {}, "");
	ASSERT_TRUE(p.ok()) << p.error().message();
	EXPECT_TRUE(p->pairs.empty());
}

TEST(GpuPlan, AutomaticRemapPairsSameModelInOrdinalOrder)
{
	auto p = plan_gpus(image_on({A1, A0}), {B0, B1}, {}, "");
	ASSERT_TRUE(p.ok()) << p.error().message();
	// Every GPU of the image is listed; A0 -> B0 and A1 -> B1 whatever the image's order.
	expect_pairs(p->pairs, {{A0, B0}, {A1, B1}}, true);
	EXPECT_NE(p->description.find("automatic"), std::string::npos);
}

TEST(GpuPlan, PartlyPresentKeepsThePresentOnesAndListsAll)
{
	auto p = plan_gpus(image_on({A0, A1}), {A1, B1}, {}, "");
	ASSERT_TRUE(p.ok()) << p.error().message();
	expect_pairs(p->pairs, {{A0, B1}, {A1, A1}}, true);
}

TEST(GpuPlan, WrongModelIsRefusedWithAHint)
{
	auto p = plan_gpus(image_on({A0}), {C0}, {}, "");
	ASSERT_FALSE(p.ok());
	EXPECT_NE(p.error().message().find("NVIDIA H200"), std::string::npos) << p.error().message();
	EXPECT_NE(p.error().message().find("CUDA_CRIU_DEVICE_MAP"), std::string::npos);
}

TEST(GpuPlan, TooFewGpusIsRefused)
{
	auto p = plan_gpus(image_on({A0, A1, A2}), {B0, B1}, {}, "");
	ASSERT_FALSE(p.ok());
	EXPECT_NE(p.error().message().find("3 x NVIDIA H200"), std::string::npos) << p.error().message();
}

TEST(GpuPlan, NoGpuAtAllIsRefused)
{
	EXPECT_FALSE(plan_gpus(image_on({A0}), {}, {}, "").ok());
}

TEST(GpuPlan, ExplicitMapByUuidAndByIndex)
{
	auto p = plan_gpus(image_on({A0, A1}), {A0, A1}, {}, A0.uuid.str() + "=" + A1.uuid.str() + ",1=0");
	ASSERT_TRUE(p.ok()) << p.error().message();
	expect_pairs(p->pairs, {{A0, A1}, {A1, A0}}, true);
}

TEST(GpuPlan, ExplicitMapOntoTheSameGpuIsStillHandedToTheDriver)
{
	auto p = plan_gpus(image_on({A0}), {A0}, {}, "0=0");
	ASSERT_TRUE(p.ok()) << p.error().message();
	ASSERT_EQ(p->pairs.size(), 1u);
	EXPECT_EQ(p->pairs[0].from, p->pairs[0].to);
}

TEST(GpuPlan, ExplicitMapMayCrossModels)
{
	auto p = plan_gpus(image_on({A0}), {C0}, {}, "0=0");
	ASSERT_TRUE(p.ok()) << p.error().message();
	ASSERT_EQ(p->pairs.size(), 1u);
}

TEST(GpuPlan, ExplicitMapErrors)
{
	EXPECT_FALSE(plan_gpus(image_on({A0}), {A0}, {}, "7=0").ok()) << "7 is not a GPU of the image";
	EXPECT_FALSE(plan_gpus(image_on({A0}), {A0}, {}, "0=5").ok()) << "no GPU 5 here";
	EXPECT_FALSE(plan_gpus(image_on({A0}), {A0}, {}, "0").ok()) << "not OLD=NEW";
	EXPECT_FALSE(plan_gpus(image_on({A0, A1}), {A0, A1}, {}, "0=1,1=1").ok()) << "two onto one";
	auto unmapped = plan_gpus(image_on({A0, A1}), {B0, B1}, {}, "0=0");
	ASSERT_FALSE(unmapped.ok()) << "A1 is absent and not in the map";
	EXPECT_NE(unmapped.error().message().find("not in the device map"), std::string::npos);
}

TEST(GpuPlan, TooLittleMemoryIsRefused)
{
	GpuInfo small = gpu(0, 0xb0, "NVIDIA H200", 1ULL << 30);
	auto p = plan_gpus(image_on({A0}, 4ULL << 30), {small}, {}, "");
	ASSERT_FALSE(p.ok());
	EXPECT_EQ(p.error().errno_value(), ENOSPC);
	EXPECT_NE(p.error().message().find("4.0 GiB"), std::string::npos) << p.error().message();
}

TEST(GpuPlan, TooLittleFreeMemoryIsRefused)
{
	GpuInfo busy = gpu(0, 0xb0, "NVIDIA H200");
	busy.free_bytes = 2ULL << 30;
	auto p = plan_gpus(image_on({A0}, 3ULL << 30), {busy}, {}, "");
	ASSERT_FALSE(p.ok());
	EXPECT_EQ(p.error().errno_value(), ENOSPC);
	EXPECT_NE(p.error().message().find("2.0 GiB free now"), std::string::npos) << p.error().message();
	busy.free_bytes = 4ULL << 30;
	EXPECT_TRUE(plan_gpus(image_on({A0}, 3ULL << 30), {busy}, {}, "").ok());
}

TEST(GpuPlan, ProcessesOnOneGpuAddUp)
{
	ImageRecord img = image_on({A0}, 3ULL << 30);
	img.processes.push_back({200, 200, CudaState::Running, {A0.uuid}, 3ULL << 30, 0, 0});
	EXPECT_FALSE(plan_gpus(img, {gpu(0, 0xb0, "NVIDIA H200", 5ULL << 30)}, {}, "").ok()) << "6 GiB onto 5 GiB";
	EXPECT_TRUE(plan_gpus(img, {gpu(0, 0xb0, "NVIDIA H200", 7ULL << 30)}, {}, "").ok());
}

// The case measured on two H200s: a process that saw only GPU 0 (CUDA_VISIBLE_DEVICES=0) held only its
// device node; restored by a CRIU that may use only GPU 1. The driver took A0 -> A1 only together with
// A1 -> A0, so the GPU no process held is paired too, onto the GPU left over (hidden from CRIU).
TEST(GpuPlan, GpusNoProcessHeldArePairedWhenAnyGpuMoves)
{
	ImageRecord img = image_on({A0});
	img.other_gpus.push_back(rec(A1));
	auto p = plan_gpus(img, {A1}, {A0, A1}, "");
	ASSERT_TRUE(p.ok()) << p.error().message();
	expect_pairs(p->pairs, {{A0, A1}, {A1, A0}});
	EXPECT_NE(p->description.find("automatic: same model"), std::string::npos) << p->description;
	EXPECT_NE(p->description.find("held by no process"), std::string::npos) << p->description;
}

TEST(GpuPlan, AMapMayPairTheGpusNoProcessHeldToo)
{
	// The driver wants every GPU paired: a map that says so for the GPU no process held is taken as is.
	ImageRecord img = image_on({A0});
	img.other_gpus.push_back(rec(A1));
	std::string map = A0.uuid.str() + "=" + A1.uuid.str() + "," + A1.uuid.str() + "=" + A0.uuid.str();
	auto p = plan_gpus(img, {A0, A1}, {A0, A1}, map);
	ASSERT_TRUE(p.ok()) << p.error().message();
	expect_pairs(p->pairs, {{A0, A1}, {A1, A0}});
	// a GPU of neither list is still refused
	auto bad = plan_gpus(img, {A0, A1}, {A0, A1}, std::string("GPU-00000000-0000-0000-0000-00000000000f=") + A1.uuid.str());
	ASSERT_FALSE(bad.ok());
	EXPECT_NE(bad.error().message().find("is not a GPU of the image"), std::string::npos);
}

// Restored inside a container's device cgroup (measured on two H200s with runc): CRIU sees only A1, the
// machine has A0 and A1. The map pairs the GPU no process held onto the GPU hidden from CRIU, as the
// automatic plan does; a held GPU's target must still be one CRIU sees.
TEST(GpuPlan, AMapMayPairTheGpusNoProcessHeldOntoGpusHiddenFromCriu)
{
	ImageRecord img = image_on({A0});
	img.other_gpus.push_back(rec(A1));
	std::string map = A0.uuid.str() + "=" + A1.uuid.str() + "," + A1.uuid.str() + "=" + A0.uuid.str();
	auto p = plan_gpus(img, {A1}, {A0, A1}, map);
	ASSERT_TRUE(p.ok()) << p.error().message();
	ASSERT_EQ(p->pairs.size(), 2u);
	EXPECT_EQ(p->pairs[0].to, A1.uuid);
	EXPECT_EQ(p->pairs[1].from, A1.uuid);
	EXPECT_EQ(p->pairs[1].to, A0.uuid);
	auto automatic = plan_gpus(img, {A1}, {A0, A1}, "");
	ASSERT_TRUE(automatic.ok()) << automatic.error().message();
	EXPECT_EQ(automatic->pairs, p->pairs);

	auto hidden = plan_gpus(image_on({A1}), {A1}, {A0, A1}, A1.uuid.str() + "=" + A0.uuid.str());
	ASSERT_FALSE(hidden.ok());
	EXPECT_NE(hidden.error().message().find("hidden from CRIU"), std::string::npos) << hidden.error().message();
	auto absent = plan_gpus(img, {A1}, {A0, A1}, A0.uuid.str() + "=" + A1.uuid.str() + "," + A1.uuid.str() + "=" + B0.uuid.str());
	ASSERT_FALSE(absent.ok());
	EXPECT_NE(absent.error().message().find("is not on this machine"), std::string::npos) << absent.error().message();
}

TEST(GpuPlan, GpusNoProcessHeldStayOnThemselvesWhenFree)
{
	ImageRecord img = image_on({A0});
	img.other_gpus.push_back(rec(A2));
	auto p = plan_gpus(img, {A1, A2}, {A0, A1, A2}, "0=1");
	ASSERT_TRUE(p.ok()) << p.error().message();
	ASSERT_EQ(p->pairs.size(), 2u);
	EXPECT_EQ(p->pairs[1].from, A2.uuid);
	EXPECT_EQ(p->pairs[1].to, A2.uuid);
}

TEST(GpuPlan, GpusNoProcessHeldAreNotPairedWhenNothingMoves)
{
	ImageRecord img = image_on({A0});
	img.other_gpus.push_back(rec(A1));
	auto p = plan_gpus(img, {A0, A1}, {A0, A1}, "");
	ASSERT_TRUE(p.ok()) << p.error().message();
	EXPECT_TRUE(p->pairs.empty());
}

TEST(GpuPlan, GpusNoProcessHeldWithoutAPartnerAreLeftOutAndSaidSo)
{
	ImageRecord img = image_on({A0});
	img.other_gpus.push_back(rec(A1));
	img.other_gpus.push_back(rec(C0));
	auto p = plan_gpus(img, {B0}, {B0}, ""); // a one-GPU machine: only the GPU the process held is paired
	ASSERT_TRUE(p.ok()) << p.error().message();
	ASSERT_EQ(p->pairs.size(), 1u);
	EXPECT_EQ(p->pairs[0].to, B0.uuid);
	EXPECT_NE(p->description.find("left unpaired"), std::string::npos) << p->description;
}

TEST(GpuPlan, MapLeavingAHeldGpuOnATakenGpuSaysSo)
{
	auto p = plan_gpus(image_on({A0, A1}), {A0, A1}, {}, "0=1");
	ASSERT_FALSE(p.ok());
	EXPECT_NE(p.error().message().find("taken by another pair"), std::string::npos) << p.error().message();
}

TEST(DriverVersion, OnlyADifferentKnownVersionIsRefused)
{
	ImageRecord img;
	img.driver_version = "580.159.04";
	EXPECT_TRUE(check_driver_version(img, "580.159.04").ok());
	EXPECT_TRUE(check_driver_version(img, "").ok()) << "version here unknown";
	auto st = check_driver_version(img, "575.57.08");
	ASSERT_FALSE(st.ok());
	EXPECT_NE(st.error().message().find("dumped under NVIDIA driver 580.159.04 and this machine runs 575.57.08"),
		  std::string::npos)
		<< st.error().message();
	img.driver_version = "CUDA 13.0"; // no kernel module version was known when dumping
	EXPECT_TRUE(check_driver_version(img, "575.57.08").ok());
	img.driver_version = "";
	EXPECT_TRUE(check_driver_version(img, "575.57.08").ok());
}

// An image's sizes cannot wrap the sum past the memory check: two processes of 2^63 bytes each onto one GPU.
TEST(GpuPlan, StateSizesThatWrapAroundAreStillTooLarge)
{
	ImageRecord img = image_on({A0});
	img.processes[0].state_bytes = 1ULL << 63;
	img.processes.push_back({101, 101, CudaState::Running, {A0.uuid}, 1ULL << 63, 0, 0});
	auto p = plan_gpus(img, {A0}, {}, "");
	ASSERT_FALSE(p.ok());
	EXPECT_EQ(p.error().errno_value(), ENOSPC) << p.error().message();
}

// A GPU name from the image reaches CRIU's log escaped.
TEST(GpuPlan, ImageTextIsEscapedInMessages)
{
	GpuInfo evil = gpu(0, 0xe0, "H200\nError (criu): \x1b[31mfake");
	auto p = plan_gpus(image_on({evil}), {C0}, {}, "");
	ASSERT_FALSE(p.ok());
	EXPECT_EQ(p.error().message().find('\n'), std::string::npos) << p.error().message();
	EXPECT_EQ(p.error().message().find('\x1b'), std::string::npos) << p.error().message();
	EXPECT_NE(p.error().message().find("H200\\x0aError"), std::string::npos) << p.error().message();
}

// cuda-criu restore --device-map of a live process: indices are this machine's; the GPUs left out of the
// map are paired too.
TEST(GpuPlan, LiveDeviceMapPairsEveryGpu)
{
	auto map = DeviceMap::parse("0=1");
	ASSERT_TRUE(map.ok());
	auto pairs = plan_live_device_map(*map, {A0, A1}, {});
	ASSERT_TRUE(pairs.ok()) << pairs.error().message();
	expect_pairs(*pairs, {{A0, A1}, {A1, A0}});
	EXPECT_FALSE(plan_live_device_map(*DeviceMap::parse("0=7"), {A0, A1}, {}).ok());
	EXPECT_FALSE(DeviceMap::parse("0").ok());
	EXPECT_FALSE(DeviceMap::parse("0=1,0=0").ok()) << "OLD twice";
}

} // namespace
} // namespace cuda_criu
