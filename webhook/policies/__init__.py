"""Admission policies: pure decisions that return structured reasons, never raise on denial.

``gpu_sharing`` validates and normalises GPU-sharing annotations, ``gpu_handoff`` prepares
a fractional pod for its shared GPU, ``quota`` words the tenant quota check, and
``config_guard`` refuses an invalid FairShareConfig ConfigMap.
"""
