"""Bookie cookies: the identity a bookie's disks were formatted with (ARCHITECTURE.md §7)."""

from __future__ import annotations

from metadata.errors import NodeExistsError, NoNodeError
from metadata.schemas import Cookie, decode, encode
from metadata.services._base import Service, validate_name


class CookieStore(Service):
    def _cookie_path(self, bookie_id: str) -> str:
        return self.path("cookies", validate_name("bookie", bookie_id))

    async def read(self, bookie_id: str) -> tuple[Cookie, int] | None:
        try:
            stored = await self.store.get(self._cookie_path(bookie_id))
        except NoNodeError:
            return None
        return decode(Cookie, stored.data), stored.version

    async def write(self, cookie: Cookie, version: int | None = None) -> int:
        """Create the cookie (version None; NodeExistsError if one exists) or replace
        it by CAS on `version`. Returns the stored version."""
        path = self._cookie_path(cookie.bookie_id)
        if version is None:
            await self.ensure(self.path("cookies"))
            try:
                await self.store.create(path, encode(cookie))
            except NodeExistsError:
                raise NodeExistsError(f"bookie {cookie.bookie_id} already has a cookie") from None
            return 0
        return await self.store.set(path, encode(cookie), version=version)

    async def delete(self, bookie_id: str, version: int = -1) -> None:
        try:
            await self.store.delete(self._cookie_path(bookie_id), version=version)
        except NoNodeError:
            pass
