"""The broker's NoticeLog (providers.base.NoticeLog): notices read from a cloud's API, one row
per pool and notice in the provider_notice table, written when first read."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlmodel import select

from broker.clock import Clock
from broker.state.model import ProviderNotice
from broker.state.store import Store


class DbNoticeLog:
    """The notices of one pool, in the database."""

    def __init__(self, store: Store, pool: str, clock: Clock) -> None:
        self.store, self.pool, self.clock = store, pool, clock

    def seen(self, key: str) -> bool:
        with self.store.session() as s:
            return s.exec(select(ProviderNotice.id).where(ProviderNotice.pool == self.pool,
                                                          ProviderNotice.key == key)).first() is not None

    def add(self, key: str, instance_id: str, kind: str, scope: str) -> bool:
        """Record a notice; False if this pool recorded it before (another broker process
        included: the unique index decides)."""
        try:
            with self.store.session() as s:
                s.add(ProviderNotice(pool=self.pool, key=key, instance_id=instance_id, kind=kind,
                                     scope=scope, seen_at=self.clock.now()))
        except IntegrityError:
            return False
        return True
