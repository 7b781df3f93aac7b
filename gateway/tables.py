"""Every table of the gateway's database on one metadata, the one migrations must match.

The models live beside the code that uses them (the ledger's, the keys'), all on the
ledger's declarative Base; a table is on ``Base.metadata`` only once its module has been
imported, so whatever compares the schema with the models imports them from here.
"""

from __future__ import annotations

from gateway.keys import models as _keys  # noqa: F401  (registers the keys' tables)
from gateway.ledger.models import Base

metadata = Base.metadata
