"""Advantage estimators (placeholder: filled in by the advantages work)."""

from rlzoo.registry import Registry

advantage_estimators: Registry[type] = Registry("advantage estimator")


def get_advantage(name: str, **options):
    return advantage_estimators.get(name)(**options)


def list_advantages() -> list[str]:
    return advantage_estimators.names()
