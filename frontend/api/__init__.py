"""The frontend's HTTP apps: a listener's native API (:mod:`.native`) and the management API
(:mod:`.management`)."""
