# Local Kubernetes control plane for the e2e tests (tools/e2e/cluster.py).
# Included by the top-level Makefile, which defines PY (the venv python) and `install`.
#
#   make cluster-bins     build kube-apiserver & co. once (needs Go; cached per version)
#   make cluster-up       start etcd, kube-apiserver, kube-controller-manager,
#                         kube-scheduler and kwok on 127.0.0.1; writes .e2e/kubeconfig
#   make cluster-status   show their health
#   make cluster-down     stop them and remove the state (logs stay in .e2e/run/logs)
#
# E2E_STATE_DIR=dir picks another state directory; SCHEDULER_CONFIG=file starts
# kube-scheduler with that KubeSchedulerConfiguration (clientConnection is filled in).

E2E_STATE_DIR ?= .e2e
SCHEDULER_CONFIG ?=
E2E_CLUSTER := $(PY) tools/e2e/cluster.py

.PHONY: cluster-up cluster-down cluster-status

cluster-up: install
	$(E2E_CLUSTER) up --state-dir $(E2E_STATE_DIR) $(if $(SCHEDULER_CONFIG),--scheduler-config $(SCHEDULER_CONFIG))

cluster-down:
	$(E2E_CLUSTER) down --state-dir $(E2E_STATE_DIR)

cluster-status:
	$(E2E_CLUSTER) status --state-dir $(E2E_STATE_DIR)
