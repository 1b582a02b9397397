# GCP, as an example to adapt: the nodes' service account (options.service_account), what
# the broker's own service account needs, and firewall rules for the nodes (options.network_tags).
# Not validated in onepool's test suite: the google provider plugin cannot be fetched there
# (`terraform fmt -check` parses it; see infra/README.md).

terraform {
  required_version = ">= 1.5"
  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 5.0, < 7.0"
    }
  }
}

variable "project" {
  type = string
}

variable "checkpoint_bucket" {
  description = "The GCS bucket of the pools' checkpoint stores (store: gs://BUCKET/PREFIX)."
  type        = string
}

variable "broker_service_account" {
  description = "The e-mail of the service account `onepool server` runs as (the pool's credentials)."
  type        = string
}

variable "network" {
  type    = string
  default = "default"
}

provider "google" {
  project = var.project
}

# The nodes run as this account: read and write checkpoints, write logs; nothing else.
resource "google_service_account" "node" {
  account_id   = "onepool-node"
  display_name = "onepool rented nodes"
}

resource "google_storage_bucket_iam_member" "node_checkpoints" {
  bucket = var.checkpoint_bucket
  role   = "roles/storage.objectUser"
  member = "serviceAccount:${google_service_account.node.email}"
}

resource "google_project_iam_member" "node_logs" {
  project = var.project
  role    = "roles/logging.logWriter"
  member  = "serviceAccount:${google_service_account.node.email}"
}

# The broker creates and deletes the VMs, and attaches the nodes' account to them.
resource "google_project_iam_member" "broker_instances" {
  project = var.project
  role    = "roles/compute.instanceAdmin.v1"
  member  = "serviceAccount:${var.broker_service_account}"
}

resource "google_service_account_iam_member" "broker_attaches_node_account" {
  service_account_id = google_service_account.node.name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${var.broker_service_account}"
}

resource "google_storage_bucket_iam_member" "broker_checkpoints" {
  bucket = var.checkpoint_bucket
  role   = "roles/storage.objectAdmin" # retention deletes old checkpoints
  member = "serviceAccount:${var.broker_service_account}"
}

# No inbound port from anywhere (agents call the server; VPC networks deny ingress by default).
# The ranks of one multi-node job talk to each other: nodes tagged onepool-node, among themselves.
resource "google_compute_firewall" "node_peers" {
  name        = "onepool-node-peers"
  network     = var.network
  direction   = "INGRESS"
  source_tags = ["onepool-node"]
  target_tags = ["onepool-node"]
  allow {
    protocol = "all"
  }
}

output "service_account" {
  description = "options.service_account"
  value       = google_service_account.node.email
}
