import sys

from kernelops.cli import main

sys.exit(main())
