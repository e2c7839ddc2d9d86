"""Shadow traffic: a sample of the requests this (stable) version answered is sent again to the candidate version,
and its outputs are compared with the ones the user got (docs/design-decisions.md, "shadow traffic")."""
