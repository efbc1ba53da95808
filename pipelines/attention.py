"""`python -m pipelines.attention`: runs `pipelines.commands.attention.main`."""

import sys

from pipelines.commands.attention import main

if __name__ == "__main__":
    sys.exit(main())
