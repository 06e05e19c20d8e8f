// rmstandin issues the NVIDIA Resource Manager ioctls a CUDA context makes,
// with the request numbers and parameter structs of the real driver, on a
// stand-in control file. No driver is behind that file, so every ioctl
// fails (ENOTTY), but the syscall tracepoints see each call exactly as they
// would on /dev/nvidiactl. Each parameter block is prefilled with what the
// driver would have written back (status NV_OK, the new client handle), so
// a tracer reading it at sys_exit finds a successful call.
//
// The structs are written out here from the driver's headers rather than
// shared with the Go package, so the two are independent checks of the
// layout.
//
// Usage: rmstandin CONTROL-FILE [--spin] [--channels]
// With --channels, every channel group gets a channel and device 1 a
// subdevice, as FIFO_DISABLE_CHANNELS needs; without, only the compute
// group of device 0 has one.
// Prints "ready FD" once the context's objects are "allocated", then
// reads commands on stdin: "timeslice US" (a SET_TIMESLICE on the compute
// channel group, as CUDA issues), "free-copy" (frees the copy-engine
// channel group), "exit". EOF exits too.
//
// With --spin it plays the GPU validation's victim instead: a thread
// stands in for the spinning kernel, advancing {time ns, count, stop} in
// memory; it prints "ready ADDR" (the struct's address) and, on "stop",
// stops the thread and prints "correct: stand-in". Nothing suspends a
// CPU thread, so a validation run against it must report that the
// "kernel" never stopped.
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

struct progress {
	volatile uint64_t ns, count, stop;
};

static struct progress prog;

static void *spin(void *arg)
{
	(void)arg;
	struct timespec ts;
	while (!prog.stop) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		prog.ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
		prog.count++;
		usleep(1);
	}
	return NULL;
}

typedef struct {
	uint32_t hRoot, hObjectParent, hObjectOld, status;
} NVOS00_PARAMETERS;

typedef struct {
	uint32_t hRoot, hObjectParent, hObjectNew, hClass;
	uint64_t pAllocParms;
	uint32_t paramsSize, status;
} NVOS21_PARAMETERS;

typedef struct {
	uint32_t hRoot, hObjectParent, hObjectNew, hClass;
	uint64_t pAllocParms;
	uint64_t pRightsRequested;
	uint32_t paramsSize, flags, status;
	uint32_t pad;
} NVOS64_PARAMETERS;

typedef struct {
	uint32_t hClient, hObject, cmd, flags;
	uint64_t params;
	uint32_t paramsSize, status;
} NVOS54_PARAMETERS;

typedef struct {
	uint32_t cmd, size;
	uint64_t ptr;
} nv_ioctl_xfer_t;

typedef struct {
	uint32_t hObjectError, hObjectEccError, hVASpace, engineType;
	uint8_t bIsCallingContextVgpuPlugin;
} NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS;

typedef struct {
	uint32_t deviceId;
	uint8_t rest[52];
} NV0080_ALLOC_PARAMETERS;

typedef struct {
	uint32_t subDeviceId;
} NV2080_ALLOC_PARAMETERS;

#define NV_IOWR(nr, size) ((3u << 30) | ((uint32_t)(size) << 16) | (0x46u << 8) | (nr))
#define ESC_RM_FREE 0x29
#define ESC_RM_CONTROL 0x2A
#define ESC_RM_ALLOC 0x2B
#define ESC_XFER 211

_Static_assert(sizeof(NVOS00_PARAMETERS) == 16, "NVOS00");
_Static_assert(sizeof(NVOS21_PARAMETERS) == 32, "NVOS21");
_Static_assert(sizeof(NVOS64_PARAMETERS) == 48, "NVOS64");
_Static_assert(sizeof(NVOS54_PARAMETERS) == 32, "NVOS54");
_Static_assert(sizeof(nv_ioctl_xfer_t) == 16, "xfer");
_Static_assert(sizeof(NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS) == 20, "TSG params");

// Handles, as in the Go test.
#define H_CLIENT 0xC1D00042u
#define H_DEVICE0 0x5C000001u
#define H_SUBDEV0 0x5C000002u
#define H_TSG_GR 0x5C000003u
#define H_CHANNEL 0x5C000004u
#define H_TSG_CE 0x5C000005u
#define H_DEVICE1 0x5C000010u
#define H_TSG_GR1 0x5C000011u
#define H_CHANNEL_CE 0x5C000006u
#define H_CHANNEL_GR1 0x5C000012u
#define H_SUBDEV1 0x5C000013u

static int ctl;

// call issues one ioctl; the driver's absence makes it fail, which is
// expected. Any other outcome than ENOTTY or EINVAL means the stand-in file
// is not what the test meant.
static void call(int fd, unsigned long req, void *arg)
{
	if (ioctl(fd, req, arg) == 0 || (errno != ENOTTY && errno != EINVAL)) {
		fprintf(stderr, "rmstandin: ioctl %#lx: unexpected result (errno %d)\n", req, errno);
		exit(2);
	}
}

static void alloc21(uint32_t parent, uint32_t handle, uint32_t cls, void *params, uint32_t size)
{
	NVOS21_PARAMETERS p = {H_CLIENT, parent, handle, cls, (uint64_t)(uintptr_t)params, size, 0};
	call(ctl, NV_IOWR(ESC_RM_ALLOC, sizeof(p)), &p);
}

static void alloc64(uint32_t parent, uint32_t handle, uint32_t cls, void *params, uint32_t size)
{
	NVOS64_PARAMETERS p = {H_CLIENT, parent, handle, cls, (uint64_t)(uintptr_t)params, 0, size, 0, 0, 0};
	call(ctl, NV_IOWR(ESC_RM_ALLOC, sizeof(p)), &p);
}

static void control(uint32_t obj, uint32_t cmd, void *params, uint32_t size)
{
	NVOS54_PARAMETERS p = {H_CLIENT, obj, cmd, 0, (uint64_t)(uintptr_t)params, size, 0};
	call(ctl, NV_IOWR(ESC_RM_CONTROL, sizeof(p)), &p);
}

int main(int argc, char **argv)
{
	int spinning = 0, channels = 0;
	for (int i = 2; i < argc; i++) {
		if (strcmp(argv[i], "--spin") == 0)
			spinning = 1;
		else if (strcmp(argv[i], "--channels") == 0)
			channels = 1;
		else
			argc = 0;
	}
	if (argc < 2) {
		fprintf(stderr, "usage: rmstandin CONTROL-FILE [--spin] [--channels]\n");
		return 2;
	}
	// Another device first, so the control file is not the lowest
	// descriptor and calls on it prove the tracer filters by device.
	int other = open("/dev/null", O_RDWR);
	ctl = open(argv[1], O_RDWR | O_CLOEXEC);
	if (other < 0 || ctl < 0) {
		perror("rmstandin: open");
		return 2;
	}

	// The client: RM chooses its handle and returns it in hObjectNew.
	NVOS21_PARAMETERS client = {0, 0, H_CLIENT, 0x41, 0, 0, 0};
	call(ctl, NV_IOWR(ESC_RM_ALLOC, sizeof(client)), &client);

	NV0080_ALLOC_PARAMETERS dev0 = {.deviceId = 0};
	alloc21(H_CLIENT, H_DEVICE0, 0x80, &dev0, sizeof(dev0));
	NV2080_ALLOC_PARAMETERS sub0 = {.subDeviceId = 0};
	alloc21(H_DEVICE0, H_SUBDEV0, 0x2080, &sub0, sizeof(sub0));

	// The compute channel group (engine GR0) in NVOS64 form, a channel
	// under it, then a copy-engine group through IOCTL_XFER_CMD.
	NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS tsg = {.engineType = 1};
	alloc64(H_DEVICE0, H_TSG_GR, 0xA06C, &tsg, sizeof(tsg));
	static uint8_t channel[368];
	alloc21(H_TSG_GR, H_CHANNEL, 0xC86F, channel, sizeof(channel));

	NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS tsgce = {.engineType = 0x09};
	NVOS21_PARAMETERS ce = {H_CLIENT, H_DEVICE0, H_TSG_CE, 0xA06C, (uint64_t)(uintptr_t)&tsgce, sizeof(tsgce), 0};
	nv_ioctl_xfer_t x = {ESC_RM_ALLOC, sizeof(ce), (uint64_t)(uintptr_t)&ce};
	call(ctl, NV_IOWR(ESC_XFER, sizeof(x)), &x);

	// A second GPU with its own compute group.
	NV0080_ALLOC_PARAMETERS dev1 = {.deviceId = 1};
	alloc21(H_CLIENT, H_DEVICE1, 0x80, &dev1, sizeof(dev1));
	NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS tsg1 = {.engineType = 1};
	alloc21(H_DEVICE1, H_TSG_GR1, 0xA06C, &tsg1, sizeof(tsg1));
	if (channels) {
		alloc21(H_TSG_CE, H_CHANNEL_CE, 0xC86F, channel, sizeof(channel));
		NV2080_ALLOC_PARAMETERS sub1 = {.subDeviceId = 0};
		alloc21(H_DEVICE1, H_SUBDEV1, 0x2080, &sub1, sizeof(sub1));
		alloc21(H_TSG_GR1, H_CHANNEL_GR1, 0xC86F, channel, sizeof(channel));
	}

	// Calls that must not be recorded: one RM refused (status
	// NV_ERR_INVALID_ARGUMENT), one on another device.
	NVOS21_PARAMETERS refused = {H_CLIENT, H_DEVICE0, 0x5C0000EE, 0xA06C, 0, 0, 0x1F};
	call(ctl, NV_IOWR(ESC_RM_ALLOC, sizeof(refused)), &refused);
	NVOS21_PARAMETERS elsewhere = {H_CLIENT, H_DEVICE0, 0x5C0000EF, 0xA06C, 0, 0, 0};
	call(other, NV_IOWR(ESC_RM_ALLOC, sizeof(elsewhere)), &elsewhere);

	// CUDA's own channel-group setup: its timeslice, then scheduling on.
	uint64_t ts = 2000;
	control(H_TSG_GR, 0xA06C0103, &ts, sizeof(ts));
	uint8_t sched[3] = {1, 0, 0};
	control(H_TSG_GR, 0xA06C0101, sched, 3);
	control(H_TSG_CE, 0xA06C0101, sched, 3);

	if (spinning) {
		pthread_t th;
		if (pthread_create(&th, NULL, spin, NULL))
			return 2;
		while (!prog.count)
			usleep(10);
		printf("ready %p\n", (void *)&prog);
		fflush(stdout);
		char cmd[64];
		if (!fgets(cmd, sizeof(cmd), stdin) || strncmp(cmd, "stop", 4) != 0)
			return 3;
		prog.stop = 1;
		pthread_join(th, NULL);
		printf("correct: stand-in, count %llu\n", (unsigned long long)prog.count);
		fflush(stdout);
		return 0;
	}

	printf("ready %d\n", ctl);
	fflush(stdout);

	char line[128];
	while (fgets(line, sizeof(line), stdin)) {
		unsigned long long us;
		if (sscanf(line, "timeslice %llu", &us) == 1) {
			ts = us;
			control(H_TSG_GR, 0xA06C0103, &ts, sizeof(ts));
		} else if (strncmp(line, "free-copy", 9) == 0) {
			NVOS00_PARAMETERS f = {H_CLIENT, H_DEVICE0, H_TSG_CE, 0};
			call(ctl, NV_IOWR(ESC_RM_FREE, sizeof(f)), &f);
		} else if (strncmp(line, "exit", 4) == 0) {
			break;
		} else {
			fprintf(stderr, "rmstandin: unknown command %s", line);
			return 2;
		}
		printf("ok\n");
		fflush(stdout);
	}
	return 0;
}
