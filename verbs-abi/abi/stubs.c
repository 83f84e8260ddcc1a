/* The provider functions perftest and libfabric import from libmlx5.so.1 and libefa.so.1,
   for a system where neither provider exists. They are reached only for Mellanox or EFA
   devices (or with flags that need one); should anything call one, it fails the documented
   way: NULL or an error number, errno EOPNOTSUPP. Arguments are declared as plain pointers
   and integers, which is how the callers pass them. Built by build.rs into both stub
   libraries (each keeps the symbols of its version script). */
#include <errno.h>
#include <stddef.h>

#define FAIL_PTR(name, ...) void *name(__VA_ARGS__) { errno = EOPNOTSUPP; return NULL; }
#define FAIL_INT(name, ...) int name(__VA_ARGS__) { errno = EOPNOTSUPP; return EOPNOTSUPP; }

FAIL_PTR(mlx5dv_create_qp, void *context, void *qp_attr, void *mlx5_qp_attr)
FAIL_INT(mlx5dv_devx_general_cmd, void *context, const void *in, size_t inlen, void *out, size_t outlen)
FAIL_PTR(mlx5dv_open_device, void *device, void *attr)
FAIL_PTR(mlx5dv_create_mkey, void *mkey_init_attr)
FAIL_INT(mlx5dv_destroy_mkey, void *mkey)
FAIL_PTR(mlx5dv_qp_ex_from_ibv_qp_ex, void *qp)
FAIL_INT(mlx5dv_crypto_login, void *context, void *login_attr)
FAIL_PTR(mlx5dv_dek_create, void *context, void *init_attr)
FAIL_INT(mlx5dv_dek_destroy, void *dek)
FAIL_PTR(efadv_create_qp_ex, void *ibvctx, void *attr_ex, void *efa_attr, unsigned int inlen)
FAIL_INT(efadv_query_device, void *ibvctx, void *attr, unsigned int inlen)
FAIL_INT(efadv_query_ah, void *ibvah, void *attr, unsigned int inlen)
FAIL_PTR(efadv_create_cq, void *ibvctx, void *attr_ex, void *efa_attr, unsigned int inlen)
FAIL_PTR(efadv_cq_from_ibv_cq_ex, void *ibvcqx)
