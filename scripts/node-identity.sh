#!/usr/bin/env bash
# Issues a node's crr-proxy identity and writes its kubeconfig.
#
#   scripts/node-identity.sh NODE [--out FILE] [--days N]
#
# Run it where kubectl has cluster-admin rights (it creates and approves a
# CertificateSigningRequest), once per node, and again before the
# certificate expires. It makes a private key, asks the cluster's
# kube-apiserver-client signer for a certificate of
#
#   user crr-proxy:node:NODE, group crr-proxy:nodes
#
# (the identity deploy/*/rbac.yaml bind and deploy/base/node-policy.yaml confine to
# NODE's CRRs), and writes a kubeconfig with both embedded, mode 0600, for
# the cluster of kubectl's current context. Install it on the node with
# `scripts/install.sh --kubeconfig FILE`. NODE must be the name crr-proxy runs
# with (--node-name; kubelet's node name).
#
#   --out FILE   where to write the kubeconfig (default: crr-proxy-NODE.kubeconfig)
#   --days N     certificate lifetime (default: 365; the signer may cap it)
set -euo pipefail

node=""
out=""
days=365
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --days) days="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "node-identity.sh: unknown argument $1" >&2; exit 2 ;;
    *) node="$1"; shift ;;
  esac
done
# A DNS subdomain, as Node names are; it also keeps the subject and the
# object names below free of anything a shell or YAML would read.
if [[ ! "$node" =~ ^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$ ]]; then
  echo "node-identity.sh: NODE must be a node name (lower-case DNS subdomain), got '$node'" >&2
  exit 2
fi
[[ "$days" =~ ^[1-9][0-9]*$ ]] || { echo "node-identity.sh: --days must be a positive number" >&2; exit 2; }
out="${out:-crr-proxy-$node.kubeconfig}"
for tool in kubectl openssl base64; do
  command -v "$tool" >/dev/null || { echo "node-identity.sh: $tool is required" >&2; exit 1; }
done

csr_name="crr-proxy-$node"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
umask 077

openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$work/key.pem" 2>/dev/null
openssl req -new -key "$work/key.pem" -subj "/O=crr-proxy:nodes/CN=crr-proxy:node:$node" \
  -out "$work/csr.pem"

# A CSR object is immutable once approved: a re-issue replaces it.
kubectl delete certificatesigningrequest "$csr_name" --ignore-not-found >/dev/null
kubectl create -f - >/dev/null <<EOF
apiVersion: certificates.k8s.io/v1
kind: CertificateSigningRequest
metadata:
  name: $csr_name
  labels:
    app.kubernetes.io/name: crr-proxy
spec:
  signerName: kubernetes.io/kube-apiserver-client
  expirationSeconds: $((days * 86400))
  usages: ["digital signature", "client auth"]
  request: $(base64 -w0 <"$work/csr.pem")
EOF
kubectl certificate approve "$csr_name" >/dev/null

certificate=""
for _ in $(seq 60); do
  certificate=$(kubectl get certificatesigningrequest "$csr_name" -o 'jsonpath={.status.certificate}')
  [[ -n "$certificate" ]] && break
  sleep 0.5
done
[[ -n "$certificate" ]] || { echo "node-identity.sh: CSR $csr_name approved but not signed after 30 s" >&2; exit 1; }

server=$(kubectl config view --raw --minify -o 'jsonpath={.clusters[0].cluster.server}')
ca=$(kubectl config view --raw --minify -o 'jsonpath={.clusters[0].cluster.certificate-authority-data}')
if [[ -z "$ca" ]]; then
  ca_file=$(kubectl config view --raw --minify -o 'jsonpath={.clusters[0].cluster.certificate-authority}')
  [[ -n "$ca_file" ]] && ca=$(base64 -w0 <"$ca_file")
fi
[[ -n "$server" ]] || { echo "node-identity.sh: kubectl's current context names no server" >&2; exit 1; }

{
  echo "apiVersion: v1"
  echo "kind: Config"
  echo "clusters:"
  echo "- name: cluster"
  echo "  cluster:"
  echo "    server: $server"
  [[ -n "$ca" ]] && echo "    certificate-authority-data: $ca"
  echo "users:"
  echo "- name: crr-proxy:node:$node"
  echo "  user:"
  echo "    client-certificate-data: $certificate"
  echo "    client-key-data: $(base64 -w0 <"$work/key.pem")"
  echo "contexts:"
  echo "- name: crr-proxy"
  echo "  context: {cluster: cluster, user: \"crr-proxy:node:$node\"}"
  echo "current-context: crr-proxy"
} >"$work/kubeconfig"
install -m 0600 "$work/kubeconfig" "$out"
echo "wrote $out for crr-proxy:node:$node (certificate from CSR $csr_name)"
