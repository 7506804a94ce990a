"""Golden wire tests: request bodies as the Kubernetes components send them, exact answers."""
