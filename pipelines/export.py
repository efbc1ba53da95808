"""`python -m pipelines.export`: runs `pipelines.commands.export.main`."""

import sys

from pipelines.commands.export import main

if __name__ == "__main__":
    sys.exit(main())
