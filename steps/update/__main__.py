"""`python -m steps.update`: the policy update step (`steps.update.train`)."""

import sys

from steps.update.train import main

sys.exit(main())
