"""`python -m pipelines.average`: runs `pipelines.commands.average.main`."""

import sys

from pipelines.commands.average import main

if __name__ == "__main__":
    sys.exit(main())
