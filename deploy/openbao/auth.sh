#!/usr/bin/env bash
# How SCO's processes log in to OpenBao, for one region: Kubernetes auth for the control
# plane's pods (one role per process kind, bound to that kind's ServiceAccount in
# deploy/k8s/base/serviceaccount.yaml) and AppRole for the nodes' agents. Idempotent: run it
# again after a change. The policies it names are `sco dev bao provision`'s (README.md).
#
#   BAO_ADDR=https://bao.example:8200 BAO_CACERT=ca.pem BAO_TOKEN=<admin token> \
#   K8S_HOST=https://<api server>:6443 [K8S_CA_FILE=k8s-ca.pem] [NAMESPACE=sco-r1] \
#   [HALLS="A B C D"] deploy/openbao/auth.sh r1
#
# tests/workers/test_openbao.py runs it against a real server and logs in as an agent.
set -euo pipefail

region=${1:?usage: auth.sh REGION}
namespace=${NAMESPACE:-sco-$region}
halls=${HALLS:-A B C D}
: "${K8S_HOST:?K8S_HOST: the Kubernetes API server OpenBao checks pod tokens with}"

methods=$(bao auth list -format=json)
enabled() { grep -q "\"$1/\"" <<<"$methods"; }
enabled kubernetes || bao auth enable kubernetes >/dev/null
enabled approle || bao auth enable approle >/dev/null

# OpenBao outside the cluster: K8S_CA_FILE is the API server's CA, and each pod's own token
# reviews itself (its ServiceAccount needs system:auth-delegator). Inside the cluster:
# leave K8S_CA_FILE unset and OpenBao uses its own pod's CA and token.
if [ -n "${K8S_CA_FILE:-}" ]; then
    bao write auth/kubernetes/config kubernetes_host="$K8S_HOST" \
        kubernetes_ca_cert=@"$K8S_CA_FILE" disable_local_ca_jwt=true >/dev/null
else
    bao write auth/kubernetes/config kubernetes_host="$K8S_HOST" >/dev/null
fi

# role <name> <service account> <policies>: the pod presents a projected ServiceAccount
# token with audience "openbao" (README.md); the OpenBao token it gets lives an hour.
role() {
    bao write "auth/kubernetes/role/$1" \
        bound_service_account_names="$2" bound_service_account_namespaces="$namespace" \
        audience=openbao token_policies="$3" token_ttl=1h token_max_ttl=4h >/dev/null
}
role "sco-$region-worker" sco-worker "sco-$region-worker"
role "sco-$region-outbox-relay" sco-outbox-relay "sco-$region-outbox-relay"
# One pod runs the ledger consumer and the drain intake: one identity, both policies.
role "sco-$region-ledger-consumer" sco-ledger-consumer \
    "sco-$region-ledger-consumer,sco-$region-drain-intake"
role "sco-$region-contract-sync" sco-contract-sync "sco-$region-contract-sync"
for hall in $halls; do
    role "sco-$region-notice-relay-$hall" "sco-notice-relay-${hall,,}" \
        "sco-$region-notice-relay-$hall"
done

# Nodes: one AppRole for the region's agents. The node's image gets the role id; each node
# gets one secret id at provisioning (single use, a day to live), trades it for a token and
# has `pki_<region>/issue/agent` issue spiffe://sco/<region>/agent/<node>.
bao write "auth/approle/role/sco-$region-agent" token_policies="sco-$region-agent" \
    token_ttl=1h token_max_ttl=4h secret_id_ttl=24h secret_id_num_uses=1 >/dev/null

echo "auth for $region: kubernetes roles in namespace $namespace, approle sco-$region-agent"
