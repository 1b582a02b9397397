# What `onepool server` (the broker) may do: exactly the calls providers/aws makes, on this
# broker's resources where EC2 can tell them apart (tests/test_infra.py checks the list
# against the calls the provider makes). Attach the policy to the role of the host the server
# runs on (this role's instance profile on EC2), or to whatever identity runs it.

locals {
  arn_prefix = "arn:${data.aws_partition.current.partition}"
  ec2_arn    = "${local.arn_prefix}:ec2:${var.region}"
}

data "aws_iam_policy_document" "broker" {
  source_policy_documents = [data.aws_iam_policy_document.node_checkpoints.json]

  statement {
    sid = "ReadOffersPricesImagesAndInstances"
    actions = [
      "ec2:DescribeAvailabilityZones",
      "ec2:DescribeImages",
      "ec2:DescribeInstanceTypes",
      "ec2:DescribeInstances",
      "ec2:DescribeSpotPriceHistory",
      "pricing:GetProducts",
    ]
    resources = ["*"]
  }

  statement {
    sid       = "RunOnlyTaggedInstances"
    actions   = ["ec2:RunInstances"]
    resources = ["${local.ec2_arn}:*:instance/*"]
    condition {
      test     = "StringLike"
      variable = "aws:RequestTag/onepool-broker"
      values   = ["op-*"]
    }
  }

  statement {
    sid     = "WhatTheInstancesAreMadeOf"
    actions = ["ec2:RunInstances"]
    resources = [
      "${local.ec2_arn}::image/*",
      "${local.ec2_arn}:*:image/*",
      "${local.ec2_arn}:*:volume/*",
      "${local.ec2_arn}:*:network-interface/*",
      "${local.ec2_arn}:*:subnet/*",
      "${local.ec2_arn}:*:security-group/*",
      "${local.ec2_arn}:*:spot-instances-request/*",
    ]
  }

  statement {
    sid     = "TagOnlyWhileLaunching"
    actions = ["ec2:CreateTags"]
    resources = [
      "${local.ec2_arn}:*:instance/*",
      "${local.ec2_arn}:*:volume/*",
      "${local.ec2_arn}:*:spot-instances-request/*",
    ]
    condition {
      test     = "StringEquals"
      variable = "ec2:CreateAction"
      values   = ["RunInstances"]
    }
  }

  statement {
    sid       = "TerminateOnlyThisBrokersInstances"
    actions   = ["ec2:TerminateInstances"]
    resources = ["${local.ec2_arn}:*:instance/*"]
    condition {
      test     = "StringLike"
      variable = "aws:ResourceTag/onepool-broker"
      values   = ["op-*"]
    }
  }

  statement {
    sid       = "GiveNodesTheirRole"
    actions   = ["iam:PassRole"]
    resources = [aws_iam_role.node.arn]
    condition {
      test     = "StringEquals"
      variable = "iam:PassedToService"
      values   = ["ec2.amazonaws.com"]
    }
  }

  statement {
    # The first spot launch of an account creates EC2 Spot's service-linked role.
    sid       = "SpotServiceLinkedRole"
    actions   = ["iam:CreateServiceLinkedRole"]
    resources = ["${local.arn_prefix}:iam::*:role/aws-service-role/spot.amazonaws.com/*"]
    condition {
      test     = "StringEquals"
      variable = "iam:AWSServiceName"
      values   = ["spot.amazonaws.com"]
    }
  }

  statement {
    sid       = "ResolvePublicImageParameters"
    actions   = ["ssm:GetParameter"]
    resources = ["${local.arn_prefix}:ssm:${var.region}::parameter/aws/service/*"]
  }

  statement {
    sid       = "ReadInterruptionNotices"
    actions   = ["sqs:ReceiveMessage", "sqs:DeleteMessage"]
    resources = [aws_sqs_queue.notices.arn]
  }

  statement {
    # Delete old checkpoints (retention). Listing, reading and writing them, as the nodes do,
    # comes from node_checkpoints (source_policy_documents above).
    sid       = "DeleteOldCheckpoints"
    actions   = ["s3:DeleteObject"]
    resources = [local.objects_arn]
  }
}

resource "aws_iam_policy" "broker" {
  name        = "${var.name}-broker"
  description = "onepool server: rent, tag and end this broker's EC2 nodes; read notices; manage checkpoints"
  policy      = data.aws_iam_policy_document.broker.json
}

data "aws_iam_policy_document" "broker_assume" {
  statement {
    actions = ["sts:AssumeRole"]
    principals {
      type        = "Service"
      identifiers = var.broker_trust_services
    }
  }
}

resource "aws_iam_role" "broker" {
  name               = "${var.name}-broker"
  description        = "onepool server (the broker)"
  assume_role_policy = data.aws_iam_policy_document.broker_assume.json
}

resource "aws_iam_role_policy_attachment" "broker" {
  role       = aws_iam_role.broker.name
  policy_arn = aws_iam_policy.broker.arn
}

resource "aws_iam_instance_profile" "broker" {
  name = "${var.name}-broker"
  role = aws_iam_role.broker.name
}
