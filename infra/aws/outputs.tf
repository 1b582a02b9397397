# The values a pool's options take (see the README's onepool.yaml).

output "instance_profile" {
  description = "options.instance_profile"
  value       = aws_iam_instance_profile.node.name
}

output "security_group_ids" {
  description = "options.security_group_ids"
  value       = [aws_security_group.node.id]
}

output "queue_url" {
  description = "options.queue_url"
  value       = aws_sqs_queue.notices.url
}

output "broker_policy_arn" {
  description = "The broker's policy (attached to the broker role; attach it elsewhere if the server runs elsewhere)."
  value       = aws_iam_policy.broker.arn
}

output "broker_instance_profile" {
  description = "For the EC2 host that runs onepool server."
  value       = aws_iam_instance_profile.broker.name
}
