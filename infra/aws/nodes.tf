# The rented nodes: their role (an instance profile, so a job reaches its S3 checkpoint store
# without keys) and their security group (no inbound port: agents call the server).

data "aws_partition" "current" {}

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "node" {
  name               = "${var.name}-node"
  description        = "onepool rented nodes: read and write the checkpoint store, nothing else"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
}

locals {
  bucket_arn  = "arn:${data.aws_partition.current.partition}:s3:::${var.checkpoint_bucket}"
  objects_arn = "${local.bucket_arn}/${var.checkpoint_prefix}/*"
}

data "aws_iam_policy_document" "node_checkpoints" {
  statement {
    sid       = "ListTheCheckpointPrefix"
    actions   = ["s3:ListBucket"]
    resources = [local.bucket_arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.checkpoint_prefix}/*"]
    }
  }
  statement {
    # Save (multipart included; the manifest's create-only write is a PutObject with
    # If-None-Match) and restore. Deleting old checkpoints is the broker's job (retention).
    sid       = "ReadAndWriteCheckpoints"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
    resources = [local.objects_arn]
  }
}

resource "aws_iam_role_policy" "node_checkpoints" {
  name   = "checkpoints"
  role   = aws_iam_role.node.id
  policy = data.aws_iam_policy_document.node_checkpoints.json
}

resource "aws_iam_instance_profile" "node" {
  name = "${var.name}-node"
  role = aws_iam_role.node.name
}

resource "aws_security_group" "node" {
  name        = "${var.name}-node"
  description = "onepool rented nodes: no inbound port from outside; agents call the server"
  vpc_id      = var.vpc_id
}

# Ranks of one multi-node job talk to each other (NCCL, the rendezvous): only within the group.
resource "aws_vpc_security_group_ingress_rule" "node_peers" {
  security_group_id            = aws_security_group.node.id
  description                  = "ranks of a multi-node job"
  ip_protocol                  = "-1"
  referenced_security_group_id = aws_security_group.node.id
}

resource "aws_vpc_security_group_egress_rule" "node_peers" {
  security_group_id            = aws_security_group.node.id
  description                  = "ranks of a multi-node job"
  ip_protocol                  = "-1"
  referenced_security_group_id = aws_security_group.node.id
}

resource "aws_vpc_security_group_egress_rule" "node_server" {
  for_each          = toset(var.server_cidrs)
  security_group_id = aws_security_group.node.id
  description       = "the agent calls onepool server"
  ip_protocol       = "tcp"
  from_port         = var.server_port
  to_port           = var.server_port
  cidr_ipv4         = each.value
}

# HTTPS out: S3 (checkpoints), package mirrors (broker.agent_package), container registries.
# DNS, the instance metadata service and Amazon Time Sync are not filtered by security groups.
resource "aws_vpc_security_group_egress_rule" "node_https" {
  security_group_id = aws_security_group.node.id
  description       = "HTTPS: S3, package and image registries"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = "0.0.0.0/0"
}
