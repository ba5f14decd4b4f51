"""The frontend's HTTP apps: a listener's native API (:mod:`.native`)."""
