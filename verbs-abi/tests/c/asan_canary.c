/* The sanitizer's canary (run by verbs-abi/tests/abi.rs only when scripts/asan.sh has built
 * the library with AddressSanitizer): it hands ibv_query_device a buffer it has freed, which
 * the C API leaves to the caller, so the instrumented library must report its write into the
 * freed buffer (heap-use-after-free) and stop the program. Were the report missing, the
 * sanitizer run would not be watching the library's own accesses at all. */
#include <stdio.h>
#include <stdlib.h>
#include <infiniband/verbs.h>

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		return 2;
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		return 3;
	struct ibv_device_attr *attr = malloc(sizeof(*attr));
	free(attr);
	ibv_query_device(ctx, attr);
	puts("not caught");
	return 0;
}
