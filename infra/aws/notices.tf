# Spot interruption warnings and rebalance recommendations: EventBridge -> SQS, read by the
# broker (the pool's options.queue_url). Agents also watch the instance metadata service; the
# queue still tells the broker when an agent cannot.

resource "aws_sqs_queue" "notices" {
  name                      = "${var.name}-notices"
  message_retention_seconds = 3600 # a notice is worth acting on for minutes, not days
  sqs_managed_sse_enabled   = true
}

locals {
  # rule name suffix -> the EC2 event it forwards
  notices = {
    spot-interruption = "EC2 Spot Instance Interruption Warning" # two minutes' notice
    rebalance         = "EC2 Instance Rebalance Recommendation"  # elevated risk of interruption
  }
}

resource "aws_cloudwatch_event_rule" "notice" {
  for_each    = local.notices
  name        = "${var.name}-${each.key}"
  description = each.value
  event_pattern = jsonencode({
    source        = ["aws.ec2"]
    "detail-type" = [each.value]
  })
}

resource "aws_cloudwatch_event_target" "notice" {
  for_each = local.notices
  rule     = aws_cloudwatch_event_rule.notice[each.key].name
  arn      = aws_sqs_queue.notices.arn
}

data "aws_iam_policy_document" "notices_queue" {
  statement {
    sid       = "OnlyTheseRulesSend"
    actions   = ["sqs:SendMessage"]
    resources = [aws_sqs_queue.notices.arn]
    principals {
      type        = "Service"
      identifiers = ["events.amazonaws.com"]
    }
    condition {
      test     = "ArnEquals"
      variable = "aws:SourceArn"
      values   = [for r in aws_cloudwatch_event_rule.notice : r.arn]
    }
  }
}

resource "aws_sqs_queue_policy" "notices" {
  queue_url = aws_sqs_queue.notices.id
  policy    = data.aws_iam_policy_document.notices_queue.json
}
