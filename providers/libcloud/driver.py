"""apache-libcloud: any compute driver by name. Credentials come from the environment
variables the pool's `credentials` names ("env:KEY_VAR,SECRET_VAR"; never secrets in the
config or the database).

- Boot: the boot script goes into the driver's user-data argument (providers.libcloud.profiles:
  Azure's ex_customdata, EC2's and OpenStack's ex_userdata, ...). A driver with none is
  refused: no agent could start there.
- Arguments: options.create_node / list_nodes / destroy_node / list_images are passed to
  those driver methods (Azure ARM: ex_resource_group, ex_network, ex_use_managed_disks, ...),
  options.auth becomes the `auth` object, options.tags join the broker's tags. Every call is
  checked against the driver's real signature when the provider is built, so a missing
  required argument is a Fatal naming it, never a TypeError at launch.
- Spot: the profile's spot arguments (EC2 ex_spot) where the driver has them; a spot pool on
  a driver without is refused when onepool.yaml is read.
- Idempotency: libcloud has no common token, so the node's NAME is made from the broker's node
  id (providers.names) and launch() first lists nodes for that name.
- Tags: the broker's ids in the profile's tags argument; on drivers without tags, nodes are
  this pool's by name (`{pool}-{8 hex}`: one broker per account and pool name).
- Images and sizes: looked up by id (or name); an unknown one is a Fatal naming the ones
  that exist. GPU type and count of a size come from options.sizes.
- Errors: every exception a driver raises is mapped to NoCapacity, Transient or Fatal.
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from providers.base import (
    TAG_BROKER,
    TAG_NODE,
    TAG_POOL,
    Fatal,
    Instance,
    InstanceState,
    Interruption,
    LaunchRequest,
    NoCapacity,
    Offer,
    Transient,
)
from providers.libcloud.profiles import DriverProfile, apply_workarounds, profile_for
from providers.names import instance_name
from providers.retry import retrying

if TYPE_CHECKING:
    from providers.options import LibcloudOptions

CAPACITY_WORDS = ("capacity", "quota", "allocationfailed", "skunotavailable", "no valid host",
                  "overconstrainedallocationrequest", "insufficientinstancecapacity")
SHOWN = 20  # images/sizes/locations named in an error


def map_error(e: Exception, kind: str = "libcloud") -> Exception:
    """Any exception a driver raised -> NoCapacity / Transient / Fatal."""
    from libcloud.common.exceptions import BaseHTTPError, RateLimitReachedError
    from libcloud.common.types import InvalidCredsError, ServiceUnavailableError

    text = f"{type(e).__name__}: {e}"
    code = getattr(e, "code", None) if isinstance(e, BaseHTTPError) else None
    if isinstance(e, RateLimitReachedError | ServiceUnavailableError | ConnectionError | TimeoutError) \
            or (isinstance(code, int) and (code == 429 or code >= 500)) or _network(e):
        return Transient(f"libcloud {kind}: {text} (temporary: retried with backoff)")
    if isinstance(e, InvalidCredsError) or code in (401, 403):
        return Fatal(f"libcloud {kind}: {text} (check the environment variables the pool's "
                     "credentials name)")
    if any(w in str(e).lower() for w in CAPACITY_WORDS):
        return NoCapacity(f"libcloud {kind}: {text} (no capacity here now: another pool will be tried)")
    return Fatal(f"libcloud {kind}: {text} (check the pool's instance_type, image and options)")


def _network(e: Exception) -> bool:
    try:
        import requests
    except ImportError:  # pragma: no cover - libcloud depends on requests
        return False
    return isinstance(e, requests.ConnectionError | requests.Timeout)


class LibcloudProvider:
    """One pool on one libcloud driver object."""

    name = "libcloud"

    def __init__(self, driver: Any, opts: LibcloudOptions, *, pool: str = "", image: str | None = None,
                 zone: str | None = None) -> None:
        self.driver, self.opts, self.pool, self.image, self.zone = driver, opts, pool, image, zone
        self.kind = str(getattr(driver, "type", opts.driver)).lower()
        create_args = list(inspect.signature(driver.create_node).parameters)
        profile = profile_for(self.kind, create_args)
        if profile is None:
            raise Fatal(f"libcloud {self.kind}: create_node takes no user data, so the node could not "
                        "start its onepool agent; this driver cannot serve a rented pool")
        self.profile: DriverProfile = profile
        self.auth = _auth(opts)
        self._check_calls()
        apply_workarounds(self.kind, driver)
        self._images: dict[str, Any] = {}

    @classmethod
    def from_config(cls, opts: LibcloudOptions, credentials: str | None, *, pool: str = "",
                    image: str | None = None, zone: str | None = None) -> LibcloudProvider:
        """Build the driver named by options.driver with the pool's credentials. Raises Fatal
        when the driver, a credential variable or a constructor argument is missing."""
        from libcloud.compute.providers import get_driver
        from libcloud.compute.types import Provider as LP

        secrets: list[str] = []
        if credentials:
            if not credentials.startswith("env:"):
                raise Fatal("libcloud credentials must name environment variables: env:KEY_VAR,SECRET_VAR")
            for var in credentials[4:].split(","):
                if var.strip() not in os.environ:
                    raise Fatal(f"libcloud credentials: environment variable {var.strip()} is not set")
                secrets.append(os.environ[var.strip()])
        try:
            driver_cls = get_driver(getattr(LP, opts.driver.upper()))
        except AttributeError:
            raise Fatal(f"libcloud has no compute driver {opts.driver!r} "
                        "(see libcloud.compute.types.Provider)") from None
        params = inspect.signature(driver_cls.__init__).parameters
        args, kwargs = list(opts.driver_args), dict(opts.driver_kwargs)
        if len(secrets) == 2 and "key" in params and "secret" in params:
            kwargs.update(key=secrets[0], secret=secrets[1])
        else:
            args = secrets + args
        try:
            inspect.signature(driver_cls).bind(*args, **kwargs)
        except TypeError as e:
            raise Fatal(f"libcloud {opts.driver}: cannot build the driver ({e}); it takes "
                        f"{_params(driver_cls.__init__)} (options.driver_args / driver_kwargs, and the "
                        "pool's credentials for key and secret)") from None
        try:
            driver = driver_cls(*args, **kwargs)
        except Exception as e:
            raise map_error(e, opts.driver.lower()) from e
        return cls(driver, opts, pool=pool, image=image, zone=zone)

    # -- calls ----------------------------------------------------------------------------------
    def _check_calls(self) -> None:
        """Every driver method onepool calls, against its real signature (Fatal on mismatch)."""
        p = self.profile
        create = {"name", "size", "image", *self.opts.create_node, *p.spot}
        create |= {a for a in (p.user_data, p.tags) if a}
        if self.zone:
            create.add("location")
        if self.auth is not None:
            create.add("auth")
        checks = [("create_node", create, "options.create_node, options.auth or the pool's zone"),
                  ("list_nodes", set(self.opts.list_nodes), "options.list_nodes"),
                  ("destroy_node", set(self.opts.destroy_node), "options.destroy_node"),
                  ("list_images", set(self.opts.list_images), "options.list_images")]
        for method, given, where in checks:
            sig = inspect.signature(getattr(self.driver, method))
            ps = sig.parameters
            if method == "destroy_node":  # the node itself, positionally
                given = {next(iter(ps)), *given}
            open_kw = any(x.kind == x.VAR_KEYWORD for x in ps.values())
            unknown = sorted(g for g in given if g not in ps and not open_kw)
            missing = sorted(n for n, x in ps.items() if x.default is x.empty and n not in given
                             and x.kind in (x.POSITIONAL_OR_KEYWORD, x.KEYWORD_ONLY))
            if unknown or missing:
                what = (f"needs {', '.join(missing)}" if missing else "") + \
                    ("; " if missing and unknown else "") + \
                    (f"does not take {', '.join(unknown)}" if unknown else "")
                raise Fatal(f"libcloud {self.kind}: {method} {what}: set {where} (it takes "
                            f"{_params(getattr(self.driver, method))})")

    def _call(self, fn: Any, *a: Any, **kw: Any) -> Any:
        try:
            return fn(*a, **kw)
        except Exception as e:
            raise map_error(e, self.kind) from e

    def _nodes(self) -> list[Any]:
        return list(self._call(self.driver.list_nodes, **self.opts.list_nodes))

    # -- the contract ---------------------------------------------------------------------------
    @retrying
    def offers(self) -> list[Offer]:
        out = []
        for sz in self._call(self.driver.list_sizes):
            gpu = self.opts.sizes.get(sz.id)
            if gpu:
                out.append(Offer("libcloud", self.zone or "", self.zone or "", sz.id, gpu[0], int(gpu[1]),
                                 "on_demand", sz.price))
        return out

    @retrying
    def launch(self, req: LaunchRequest) -> Instance:
        name = instance_name(req.node_id)
        for n in self._nodes():
            if n.name == name and _state(n) != InstanceState.GONE:
                return self._instance(n, req.market)
        p = self.profile
        if req.market == "spot" and not p.spot:
            raise Fatal(f"libcloud {self.kind}: the driver has no spot option; use market: on_demand")
        kw: dict[str, Any] = {"name": name, "size": self._size(req.instance_type),
                              "image": self._image(req.image or self.image), **self.opts.create_node}
        if self.zone:
            kw["location"] = self._location(self.zone)
        if self.auth is not None:
            kw["auth"] = self.auth
        if p.user_data:
            kw[p.user_data] = req.user_data.encode() if p.user_data_bytes else req.user_data
        if p.tags:
            kw[p.tags] = {**self.opts.tags, **req.tags()}
        if req.market == "spot":
            kw.update(p.spot)
        return self._instance(self._call(self.driver.create_node, **kw), req.market)

    def _size(self, size_id: str) -> Any:
        return self._one(self.driver.list_sizes, size_id, "size", "instance_type")

    def _image(self, image_id: str | None) -> Any:
        """The pool's image. Drivers whose profile scopes images (Azure: the versions of a
        sku) look it up in that listing; others ask get_image, then search
        list_images(**options.list_images). Raises Fatal naming the images that exist."""
        key = image_id or ""
        if key in self._images:
            return self._images[key]
        found, why, images = None, "", None
        scope = self.profile.image_scope
        if image_id and scope is not None:
            try:
                narrow = scope(image_id)
            except ValueError as e:
                raise Fatal(f"libcloud {self.kind}: image: {e}") from None
            images = self._call(self.driver.list_images, **{**self.opts.list_images, **narrow})
            found = _match(image_id, images)
            if found is not None and found.id != image_id:  # `latest`: the API resolves it
                found = self._call(self.driver.get_image, image_id)
        elif image_id:
            try:
                found = self._call(self.driver.get_image, image_id)
            except Fatal as e:
                why = f" ({e})" if not isinstance(e.__cause__, NotImplementedError) else ""
        if found is None:
            if images is None:
                images = self._call(self.driver.list_images, **self.opts.list_images)
                found = _match(image_id, images) if image_id else None
            if found is None:
                what = f"no image {image_id!r}{why}" if image_id else "the pool has no image"
                raise Fatal(f"libcloud {self.kind}: {what}; set the pool's image to one that exists: "
                            f"{_names(i.id for i in images)}")
        self._images[key] = found
        return found

    def _location(self, zone: str) -> Any:
        return self._one(self.driver.list_locations, zone, "location", "zone")

    def _one(self, list_all: Any, wanted: str, what: str, field: str) -> Any:
        """The item of list_all() whose id or name is `wanted`; Fatal naming the ones that exist."""
        items = self._call(list_all)
        found = next((x for x in items if wanted in (x.id, x.name)), None)
        if found is None:
            raise Fatal(f"libcloud {self.kind}: no {what} {wanted!r} (check the pool's {field}; "
                        f"{what}s that exist: {_names(x.id for x in items)})")
        return found

    @retrying
    def terminate(self, instance_id: str) -> None:
        for n in self._nodes():
            if n.id == instance_id and _state(n) != InstanceState.GONE:
                self._call(self.driver.destroy_node, n, **self.opts.destroy_node)

    @retrying
    def poll(self, broker_id: str) -> list[Instance]:
        out = []
        for n in self._nodes():
            inst = self._instance(n, broker_id=broker_id)
            if inst.state != InstanceState.GONE and inst.tags.get(TAG_BROKER) == broker_id:
                out.append(inst)
        return sorted(out, key=lambda i: i.instance_id)

    @retrying
    def describe(self, instance_id: str) -> Instance | None:
        for n in self._nodes():
            if n.id == instance_id and _state(n) != InstanceState.GONE:
                return self._instance(n)
        return None

    def interruptions(self) -> list[Interruption]:
        return []  # libcloud drivers expose no interruption channel (agents watch metadata)

    def _instance(self, n: Any, market: str | None = None, broker_id: str = "") -> Instance:
        return Instance(n.id, _state(n), self._tags(n, broker_id), n.extra.get("zone") or self.zone,
                        market)

    def _tags(self, n: Any, broker_id: str) -> dict[str, str]:
        """The broker's ids on a node: its tags, or on a driver without tags, from its name
        (`{pool}-{8 hex}` is this pool's, taken as `broker_id`'s)."""
        if self.profile.tags:
            return {str(k): str(v) for k, v in dict(n.extra.get(self.profile.tags_extra) or {}).items()}
        if self.pool and re.fullmatch(re.escape(self.pool) + r"-[0-9a-f]{8}", n.name or ""):
            return {TAG_BROKER: broker_id, TAG_POOL: self.pool, TAG_NODE: n.name}
        return {}

    def ack(self, notices: list[Interruption]) -> None:
        return None  # nothing to acknowledge


def _auth(opts: LibcloudOptions) -> Any:
    """options.auth as libcloud's NodeAuthSSHKey / NodeAuthPassword (None if unset)."""
    if opts.auth is None:
        return None
    from libcloud.compute.base import NodeAuthPassword, NodeAuthSSHKey

    a = opts.auth
    if a.ssh_key:
        return NodeAuthSSHKey(a.ssh_key)
    if a.ssh_key_file:
        try:
            return NodeAuthSSHKey(Path(a.ssh_key_file).expanduser().read_text().strip())
        except OSError as e:
            raise Fatal(f"options.auth.ssh_key_file: cannot read {a.ssh_key_file}: {e.strerror}") from None
    var = a.password_env or ""
    if var not in os.environ:
        raise Fatal(f"options.auth.password_env: environment variable {var} is not set")
    return NodeAuthPassword(os.environ[var])


def _match(image_id: str, images: list[Any]) -> Any:
    """The image with this id or name; for an id ending in `:latest`, the newest image of that
    prefix (versions compared as numbers where they are numbers)."""
    found = next((i for i in images if image_id in (i.id, i.name)), None)
    if found is not None or not image_id.endswith(":latest"):
        return found
    prefix = image_id.removesuffix("latest")
    same = [i for i in images if str(i.id).startswith(prefix)]

    def version(i: Any) -> tuple[tuple[int, str], ...]:
        parts = re.split(r"[.-]", str(i.id)[len(prefix):])
        return tuple((int(p), "") if p.isdigit() else (-1, p) for p in parts)

    return max(same, key=version, default=None)


def _params(fn: Any) -> str:
    return ", ".join(n for n in inspect.signature(fn).parameters if n != "self") or "nothing"


def _names(ids: Any) -> str:
    ids = sorted({str(i) for i in ids})
    return ", ".join(ids[:SHOWN]) + (f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else "") or "none"


def _state(n: Any) -> InstanceState:
    from libcloud.compute.types import NodeState as S

    return {S.RUNNING: InstanceState.RUNNING, S.PENDING: InstanceState.PENDING,
            S.STARTING: InstanceState.PENDING, S.REBOOTING: InstanceState.PENDING,
            S.STOPPING: InstanceState.STOPPING, S.STOPPED: InstanceState.GONE,
            S.TERMINATED: InstanceState.GONE}.get(n.state, InstanceState.PENDING)
