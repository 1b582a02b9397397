"""AWS EC2 capacity through boto3 (see providers.aws.ec2)."""

from providers.aws.ec2 import AwsProvider, client_config
from providers.aws.errors import map_error

__all__ = ["AwsProvider", "client_config", "map_error"]
