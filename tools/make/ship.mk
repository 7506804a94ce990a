# Shipping fairshare: the container image, a kind cluster, the manifests.
# Included by the top-level Makefile, which defines PY (the venv python), VENV and the
# `install` target. `make help-ship` lists the targets below with their one-line help.
#
#   make image kind-up deploy     build, start kind with the image loaded, install
#   make kind-e2e                 the e2e suite against that kind cluster
#
# IMAGE must match the manifests' image (or an `images:` override in your overlay): kind
# nodes run what `kind load` gave them (imagePullPolicy IfNotPresent; never tag :latest).

SHIP_MK := $(lastword $(MAKEFILE_LIST))

IMAGE ?= ghcr.io/fairshare/fairshare:0.1.0
DOCKER ?= docker
KIND ?= kind
KIND_CLUSTER ?= fairshare
KIND_CONFIG ?= manifests/kind/cluster.yaml
# Host directory the kind control plane mounts (see manifests/kind/cluster.yaml).
KIND_SHARED_DIR ?= /tmp/fairshare-kind
# A standalone kubeconfig for the kind cluster (the e2e suite's E2E_KUBECONFIG).
KIND_KUBECONFIG ?= .e2e/kind-$(KIND_CLUSTER).kubeconfig
KUBECTL ?= kubectl
# Extra kubectl flags for `deploy`, e.g. KUBECTL_FLAGS="--context prod-eu".
KUBECTL_FLAGS ?=
OVERLAY ?= manifests/overlays/second-scheduler
ROLLOUT_TIMEOUT ?= 180s

.PHONY: help-ship image kind-up kind-down deploy kind-e2e

help-ship: ## list the shipping targets
	@grep -E '^[a-z0-9-]+:.*## ' $(SHIP_MK) | \
		awk 'BEGIN {FS = ":.*## "} {printf "  %-10s %s\n", $$1, $$2}'

image: ## build the container image (IMAGE=...) from the multi-stage Dockerfile
	@command -v $(DOCKER) >/dev/null 2>&1 || { \
		echo "make image: '$(DOCKER)' not found. Install Docker (or set DOCKER=podman);" \
			"without it the e2e suite still proves the wheel works." >&2; \
		exit 1; }
	$(DOCKER) build -t $(IMAGE) .

kind-up: install ## create the kind cluster (KIND_CLUSTER=fairshare, context kind-fairshare) and load IMAGE
	@command -v $(KIND) >/dev/null 2>&1 || { \
		echo "make kind-up: '$(KIND)' not found; install it from https://kind.sigs.k8s.io" >&2; \
		exit 1; }
	@command -v $(DOCKER) >/dev/null 2>&1 || { \
		echo "make kind-up: '$(DOCKER)' not found; kind runs its nodes in Docker" >&2; \
		exit 1; }
	mkdir -p $(KIND_SHARED_DIR) $(dir $(KIND_KUBECONFIG))
	@# The apiserver's client certificate for the webhook's --client-ca, read at creation.
	test -f $(KIND_SHARED_DIR)/client-ca.crt || \
		$(VENV)/bin/fairshare client-certs --out $(KIND_SHARED_DIR)
	@if $(KIND) get clusters 2>/dev/null | grep -qx '$(KIND_CLUSTER)'; then \
		echo "kind cluster $(KIND_CLUSTER) already exists; reusing it"; \
	else \
		$(KIND) create cluster --name $(KIND_CLUSTER) --config $(KIND_CONFIG); \
	fi
	$(KIND) get kubeconfig --name $(KIND_CLUSTER) > $(KIND_KUBECONFIG)
	$(KIND) load docker-image $(IMAGE) --name $(KIND_CLUSTER)

kind-down: ## delete the kind cluster and its kubeconfig file
	$(KIND) delete cluster --name $(KIND_CLUSTER)
	rm -f $(KIND_KUBECONFIG)

deploy: install ## kubectl apply -k OVERLAY (default second-scheduler; current kubectl context) and wait for the rollout
	@# Client certificates made by kind-up: store them as the Secrets the Job then keeps.
	if test -f $(KIND_SHARED_DIR)/client-ca.crt; then \
		$(KUBECTL) $(KUBECTL_FLAGS) apply -f manifests/base/namespace.yaml && \
		$(VENV)/bin/fairshare client-certs --out $(KIND_SHARED_DIR) --reuse \
			--secrets fairshare-system --kubeconfig "$${KUBECONFIG:-$$HOME/.kube/config}"; \
	fi
	$(KUBECTL) $(KUBECTL_FLAGS) apply -k $(OVERLAY)
	@# The certificate Job exists unless the overlay uses cert-manager.
	if $(KUBECTL) $(KUBECTL_FLAGS) -n fairshare-system get job/fairshare-certs >/dev/null 2>&1; then \
		$(KUBECTL) $(KUBECTL_FLAGS) -n fairshare-system wait --for=condition=complete \
			job/fairshare-certs --timeout=$(ROLLOUT_TIMEOUT); \
	fi
	for d in $$($(KUBECTL) $(KUBECTL_FLAGS) -n fairshare-system get deployments -o name); do \
		$(KUBECTL) $(KUBECTL_FLAGS) -n fairshare-system rollout status $$d \
			--timeout=$(ROLLOUT_TIMEOUT) || exit 1; \
	done

kind-e2e: install ## run the e2e suite (tests/e2e) against the kind cluster via E2E_KUBECONFIG
	@test -f $(KIND_KUBECONFIG) || { \
		echo "make kind-e2e: $(KIND_KUBECONFIG) not found; run 'make kind-up' first" >&2; \
		exit 1; }
	E2E_KUBECONFIG=$(abspath $(KIND_KUBECONFIG)) $(PY) -m pytest tests/e2e
