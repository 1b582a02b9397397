variable "region" {
  description = "The region of the pools (one stack per region: the queue, rules and security group are regional)."
  type        = string
}

variable "name" {
  description = "Prefix of every resource name. The broker's policy reads queues named onepool-*."
  type        = string
  default     = "onepool"
}

variable "vpc_id" {
  description = "The VPC of the pools' subnets (options.subnet_ids)."
  type        = string
}

variable "checkpoint_bucket" {
  description = "The S3 bucket of the pools' checkpoint stores (store: s3://BUCKET/PREFIX)."
  type        = string
}

variable "checkpoint_prefix" {
  description = "The key prefix of the checkpoint stores in that bucket (no leading or trailing slash)."
  type        = string
  default     = "checkpoints"
}

variable "server_cidrs" {
  description = "Where `onepool server` listens (broker.server_url), as CIDRs: the nodes' agents call it."
  type        = list(string)
}

variable "server_port" {
  description = "The port of broker.server_url."
  type        = number
  default     = 8421
}

variable "broker_trust_services" {
  description = "AWS services that may assume the broker's role (ec2.amazonaws.com: the server runs on EC2)."
  type        = list(string)
  default     = ["ec2.amazonaws.com"]
}
