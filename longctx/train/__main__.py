import sys

from longctx.util.quiet import quiet_megatron_notices

quiet_megatron_notices()

from longctx.train.loop import main  # noqa: E402 - after the filter, which must see megatron's import

if __name__ == "__main__":
    sys.exit(main())
