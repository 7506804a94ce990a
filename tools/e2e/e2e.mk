# Local Kubernetes control plane for the e2e tests (tools/e2e/cluster.py).
# Included by the top-level Makefile, which defines PY (the venv python) and `install`.
#
#   make cluster-bins     build kube-apiserver & co. once (needs Go; cached per version)
#   make cluster-up       start etcd, kube-apiserver, kube-controller-manager,
#                         kube-scheduler and kwok on 127.0.0.1; writes .e2e/kubeconfig
#   make cluster-status   show their health
#   make cluster-down     stop them and remove the state (logs stay in .e2e/run/logs)
#
#   make dev-up           cluster-up, then fairshare webhook + extender as local processes,
#                         registered with the apiserver (webhooks by URL) and kube-scheduler
#                         (extender); FAIRSHARE_CONFIG=file fills the ConfigMap;
#                         DEV_NODES=2 kwok GPU nodes of DEV_GPUS=8 GPUs (DEV_NODES=0: none)
#   make dev-down         unregister and stop them (the cluster keeps running)
#   make dev-status       are both servers ready?
#
# E2E_STATE_DIR=dir picks another state directory; SCHEDULER_CONFIG=file starts
# kube-scheduler with that KubeSchedulerConfiguration (clientConnection is filled in).

E2E_STATE_DIR ?= .e2e
SCHEDULER_CONFIG ?=
FAIRSHARE_CONFIG ?=
DEV_NODES ?= 2
DEV_GPUS ?= 8
E2E_CLUSTER := $(PY) tools/e2e/cluster.py
E2E_DEV := $(PY) tools/e2e/dev.py

.PHONY: cluster-up cluster-down cluster-status dev-up dev-down dev-status

cluster-up: install
	$(E2E_CLUSTER) up --state-dir $(E2E_STATE_DIR) $(if $(SCHEDULER_CONFIG),--scheduler-config $(SCHEDULER_CONFIG))

cluster-down:
	$(E2E_CLUSTER) down --state-dir $(E2E_STATE_DIR)

cluster-status:
	$(E2E_CLUSTER) status --state-dir $(E2E_STATE_DIR)

dev-up: install
	$(E2E_DEV) up --state-dir $(E2E_STATE_DIR) $(if $(FAIRSHARE_CONFIG),--config $(FAIRSHARE_CONFIG)) \
	  --nodes $(DEV_NODES) --gpus $(DEV_GPUS)

dev-down:
	$(E2E_DEV) down --state-dir $(E2E_STATE_DIR)

dev-status:
	$(E2E_DEV) status --state-dir $(E2E_STATE_DIR)
