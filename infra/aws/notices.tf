# Spot interruption warnings and rebalance recommendations: EventBridge -> SQS, read by the
# broker (the pool's options.queue_url). Agents also watch the instance metadata service; the
# queue still tells the broker when an agent cannot.

resource "aws_sqs_queue" "notices" {
  name                      = "${var.name}-notices"
  message_retention_seconds = 3600 # a notice is worth acting on for minutes, not days
  sqs_managed_sse_enabled   = true
}

resource "aws_cloudwatch_event_rule" "spot_interruption" {
  name        = "${var.name}-spot-interruption"
  description = "EC2 Spot Instance Interruption Warning (two minutes' notice)"
  event_pattern = jsonencode({
    source        = ["aws.ec2"]
    "detail-type" = ["EC2 Spot Instance Interruption Warning"]
  })
}

resource "aws_cloudwatch_event_rule" "rebalance" {
  name        = "${var.name}-rebalance"
  description = "EC2 Instance Rebalance Recommendation (elevated risk of interruption)"
  event_pattern = jsonencode({
    source        = ["aws.ec2"]
    "detail-type" = ["EC2 Instance Rebalance Recommendation"]
  })
}

resource "aws_cloudwatch_event_target" "spot_interruption" {
  rule = aws_cloudwatch_event_rule.spot_interruption.name
  arn  = aws_sqs_queue.notices.arn
}

resource "aws_cloudwatch_event_target" "rebalance" {
  rule = aws_cloudwatch_event_rule.rebalance.name
  arn  = aws_sqs_queue.notices.arn
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
      values   = [aws_cloudwatch_event_rule.spot_interruption.arn, aws_cloudwatch_event_rule.rebalance.arn]
    }
  }
}

resource "aws_sqs_queue_policy" "notices" {
  queue_url = aws_sqs_queue.notices.id
  policy    = data.aws_iam_policy_document.notices_queue.json
}
