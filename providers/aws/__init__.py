"""AWS EC2 capacity through boto3 (see providers.aws.ec2)."""

from providers.aws.ec2 import AwsProvider, map_error

__all__ = ["AwsProvider", "map_error"]
