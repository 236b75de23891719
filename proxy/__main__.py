import sys

from proxy.process.cli import main

sys.exit(main())
