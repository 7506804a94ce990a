"""Admission policies: pure decisions that return structured reasons, never raise on denial.

``gpu_sharing`` validates and normalises GPU-sharing annotations, ``quota`` checks a
tenant's limit across its namespaces, ``config_guard`` refuses an invalid FairShareConfig
ConfigMap. None of them may import aiohttp, kubernetes_asyncio or prometheus_client.
"""
