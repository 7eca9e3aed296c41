import sys

from longctx.util.quiet import quiet_megatron_notices

quiet_megatron_notices()

from longctx.mcore.deferred_compile import compile_on_first_call  # noqa: E402 - after the filter, as below

# megatron-core's import decorates its fused kernels with torch.compile: each compiles on its first call
with compile_on_first_call():
    from longctx.train.loop import main  # after the filter, which must see megatron's import

if __name__ == "__main__":
    sys.exit(main())
