"""The frontend's HTTP APIs: the listeners' native API and the management API."""
