"""Any apache-libcloud compute driver (Azure ARM, OpenStack, ...) (see providers.libcloud.driver)."""

from providers.libcloud.driver import LibcloudProvider, map_error

__all__ = ["LibcloudProvider", "map_error"]
