"""``config.yaml``: its schema, what the serve flags write into it and which deployments
a configuration uses."""
