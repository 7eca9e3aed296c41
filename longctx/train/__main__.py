import sys

from longctx.train.loop import main

if __name__ == "__main__":
    sys.exit(main())
