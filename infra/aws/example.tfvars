# terraform apply -var-file=example.tfvars (values are examples)
region            = "us-east-1"
vpc_id            = "vpc-0123456789abcdef0"
checkpoint_bucket = "my-lab-checkpoints"
checkpoint_prefix = "checkpoints"
server_cidrs      = ["10.0.0.5/32"]
