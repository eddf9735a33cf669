# kubelet's runtime and image endpoints, switched to crr-proxy's socket where
# they survive `kubeadm upgrade`, and put back as they were. Sourced by
# install.sh, which sets: root (DESTDIR or empty), socket, conf_dir,
# kubelet_config (the KubeletConfiguration file, relative to root),
# kubelet_unit (kubelet's systemd unit).
#
# kubelet takes each endpoint from, last wins: its --config file, then the
# drop-ins of its --config-dir (*.conf, in lexical order), then its flags
# (cmd/kubelet/app/server.go, loadConfigFile and mergeKubeletConfigurations).
# kubeadm, on every init, join and upgrade:
# - rewrites /var/lib/kubelet/config.yaml from the kubelet-config ConfigMap,
#   so an edit there alone is lost on the next `kubeadm upgrade node`;
# - with NodeLocalCRISocket (beta and on by default from 1.34) keeps the
#   node's runtime endpoint in /var/lib/kubelet/instance-config.yaml and
#   merges it into config.yaml; from a flag in kubeadm-flags.env it moves the
#   value there, so a switched flag stays switched;
# - before that, passed it as --container-runtime-endpoint in
#   /var/lib/kubelet/kubeadm-flags.env, which it leaves as it is on upgrade.
# kubeadm's drop-in for kubelet.service reads kubeadm-flags.env and then
# /etc/default/kubelet (/etc/sysconfig/kubelet on RPM systems), KUBELET_EXTRA_ARGS.
#
# So, per endpoint: a flag that sets it is switched where it stands; else a
# --config-dir gets a drop-in of crr-proxy's own; else the runtime endpoint
# is switched in instance-config.yaml where there is one, and both in the
# --config file (where kubelet reads them until kubeadm next merges).
#
# Every change is one row of $switch_record (tab-separated), so that
# --uninstall puts back exactly what it changed, in the files as they are by
# then, and leaves alone whatever someone else changed since:
#   line    FILE KEY OLD-LINE NEW-LINE   a YAML line replaced (OLD empty: appended)
#   flag    FILE FLAG OLD-WORD NEW-WORD  a flag's word replaced
#   newline FILE                         a final newline added before appending
#   created FILE                         a drop-in written whole

switch_record="$conf_dir/kubelet-switch"
flag_files=(/var/lib/kubelet/kubeadm-flags.env /etc/default/kubelet /etc/sysconfig/kubelet)
instance_config=/var/lib/kubelet/instance-config.yaml
dropin_name=99-crr-proxy.conf
kubelet_touched=false
# Set when a key had nowhere to go: no kubelet configuration file.
kubelet_unswitched=false

# Appends a row, replacing an earlier row for the same file and key (a
# re-run after kubeadm undid a switch: the value seen now is the one to put
# back).
remember() {
  local kind="$1" file="$2" key="${3:-}"
  if [[ -f $switch_record ]]; then
    awk -F '\t' -v k="$kind" -v f="$file" -v key="$key" \
      '!($1 == k && $2 == f && $3 == key)' "$switch_record" >"$switch_record.tmp"
    mv "$switch_record.tmp" "$switch_record"
  fi
  printf '%s\t%s\t%s\t%s\t%s\n' "$kind" "$file" "$key" "${4:-}" "${5:-}" >>"$switch_record"
  kubelet_touched=true
}

# Writes $2 over $1 keeping $1's owner and mode.
overwrite() { cat "$2" >"$1" && rm -f "$2"; }

# Replaces the first line of $1 equal to $2 with $3 (no line when empty).
replace_line() {
  awk -v old="$2" -v new="$3" '
    !done && $0 == old { done = 1; if (new != "") print new; next }
    { print }' "$1" >"$1.crr-proxy.tmp"
  overwrite "$1" "$1.crr-proxy.tmp"
}

# Replaces every occurrence of the word $2 in $1 with $3.
replace_word() {
  awk -v old="$2" -v new="$3" '{
      out = ""
      while ((i = index($0, old)) > 0) { out = out substr($0, 1, i - 1) new; $0 = substr($0, i + length(old)) }
      print out $0
    }' "$1" >"$1.crr-proxy.tmp"
  overwrite "$1" "$1.crr-proxy.tmp"
}

# The first line of $1 setting the top-level key $2.
key_line() { grep -m1 "^$2:" "$1" || true; }

# A YAML line's value without quotes.
line_value() { sed -E "s/^[^:]*:[[:space:]]*//; s/[[:space:]]+#.*$//; s/^\"(.*)\"\$/\1/; s/^'(.*)'\$/\1/" <<<"$1"; }

# The first word of $1 that sets the flag $2 (--flag=value or --flag value).
flag_word() { grep -o -m1 -E -- "$2(=|[[:space:]]+)[^[:space:]\"']+" "$1" | head -n1 || true; }

# The value in the word $1 that sets the flag $2 (as flag_word gives it).
word_value() { sed -E "s/^$2(=|[[:space:]]+)//" <<<"$1"; }

# Points the top-level key $2 of the YAML file $1 (relative to root) at the socket.
switch_line() {
  local rel="$1" key="$2" file="$root$1" cur
  cur="$(key_line "$file" "$key")"
  [[ -n $cur && "$(line_value "$cur")" == "$socket" ]] && return 0
  if [[ -n $cur ]]; then
    replace_line "$file" "$cur" "$key: $socket"
  else
    # A last line without its newline would run into the line appended.
    if [[ -s $file && -n "$(tail -c1 "$file")" ]]; then
      echo >>"$file"
      remember newline "$rel"
    fi
    echo "$key: $socket" >>"$file"
  fi
  remember line "$rel" "$key" "$cur" "$key: $socket"
}

# Points the flag $2 in the flags file $1 at the socket; fails when the file
# does not set it.
switch_flag() {
  local rel="$1" flag="$2" file="$root$1" cur
  [[ -f $file ]] || return 1
  cur="$(flag_word "$file" "$flag")"
  [[ -n $cur ]] || return 1
  [[ "$cur" == "$flag=$socket" ]] && return 0
  replace_word "$file" "$cur" "$flag=$socket"
  echo "switched kubelet's $flag in $rel"
  remember flag "$rel" "$flag" "$cur" "$flag=$socket"
}

# kubelet's --config-dir, where a flags file gives one.
config_dir() {
  local rel word
  for rel in "${flag_files[@]}"; do
    [[ -f $root$rel ]] || continue
    word="$(flag_word "$root$rel" --config-dir)"
    if [[ -n $word ]]; then
      word_value "$word" --config-dir
      return
    fi
  done
}

# Writes the drop-in setting the keys $2... in the --config-dir $1.
switch_dropin() {
  local rel="$1/$dropin_name" key content
  content="# Written by crr-proxy's install.sh; its --uninstall removes it.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration"
  shift
  for key in "$@"; do content+=$'\n'"$key: $socket"; done
  [[ -f $root$rel && "$(cat "$root$rel")" == "$content" ]] && return 0
  install -d "$(dirname "$root$rel")"
  printf '%s\n' "$content" >"$root$rel"
  echo "wrote kubelet's drop-in $rel"
  remember created "$rel"
}

# Installs made before the record kept a copy of the --config file and its
# path; their two endpoint lines become rows.
migrate_backup() {
  local backup="$conf_dir/kubelet-config.orig" path="$conf_dir/kubelet-config.path" file key
  local touched=$kubelet_touched
  [[ -f $backup && -f $path && ! -f $switch_record ]] || return 0
  file="$(cat "$path")"
  if [[ -n "$(tail -c1 "$backup")" ]]; then remember newline "$file"; fi
  for key in containerRuntimeEndpoint imageServiceEndpoint; do
    remember line "$file" "$key" "$(key_line "$backup" "$key")" "$key: $socket"
  done
  rm -f "$backup"
  kubelet_touched=$touched
}

# True when the configuration file $1 is YAML of one key per line, the
# only form switch_line edits. kubelet reads JSON as well (the EKS AL2023
# layout writes config.json), and YAML's flow style is JSON-like: both
# start with `{` (after comments and blank lines), and a line appended to
# them parses as neither.
block_yaml() {
  local first
  first="$(grep -v -E '^[[:space:]]*(#.*)?$' "$1" | head -n1 || true)"
  [[ ! $first =~ ^[[:space:]]*[\{\[] ]]
}

# kubelet's unit files: its unit and the unit's drop-ins, wherever systemd
# reads them. Some layouts write kubelet's flags into the unit itself
# (EKS AL2023's nodeadm: --container-runtime-endpoint on ExecStart).
unit_files() {
  local dir
  for dir in /etc/systemd/system /usr/lib/systemd/system /lib/systemd/system; do
    [[ ! -f $root$dir/$kubelet_unit ]] || printf '%s\n' "$root$dir/$kubelet_unit"
    [[ ! -d $root$dir/$kubelet_unit.d ]] ||
      find "$root$dir/$kubelet_unit.d" -maxdepth 1 -name '*.conf' -type f | LC_ALL=C sort
  done
}

# The unit file that sets the flag $1 on kubelet's command line, if any.
unit_flagged() {
  local file
  while IFS= read -r file; do
    if [[ -n "$(flag_word "$file" "$1")" ]]; then
      printf '%s\n' "${file#"$root"}"
      return
    fi
  done < <(unit_files)
}

# True when a flags file sets kubelet's --container-runtime-endpoint.
runtime_flagged() {
  local rel
  for rel in "${flag_files[@]}"; do
    [[ -f $root$rel && -n "$(flag_word "$root$rel" --container-runtime-endpoint)" ]] && return 0
  done
  return 1
}

# Points kubelet at the socket; sets kubelet_touched when a file changed.
switch_kubelet() {
  local config="$root$kubelet_config" dir rel key keys=() dropin=() flagged
  migrate_backup
  local touched
  if [[ -f $conf_dir/kubelet-config.path && "$(cat "$conf_dir/kubelet-config.path")" != "$kubelet_config" ]]; then
    echo "install.sh: crr-proxy already switched $(cat "$conf_dir/kubelet-config.path"); run --uninstall first" >&2
    return 1
  fi
  dir="$(config_dir)"
  # A flag written into kubelet's unit wins over every file install.sh
  # edits, and install.sh does not edit units.
  rel="$(unit_flagged --container-runtime-endpoint)"
  if [[ -n $rel ]] && ! runtime_flagged; then
    echo "install.sh: $rel sets kubelet's --container-runtime-endpoint on its command line (EKS AL2023's nodeadm does), which wins over kubelet's files and which install.sh does not edit; kubelet is left as it is. Point that flag (and --image-service-endpoint, if set) at $socket where your node's bootstrap keeps it, then restart kubelet" >&2
    kubelet_unswitched=true
    return 0
  fi
  # The runtime endpoint goes into the --config file when neither a flag
  # nor a --config-dir takes it; a file that switch_line cannot edit is
  # refused before anything changes (kubelet would not start on it).
  if [[ -z $dir && -f $config ]] && ! block_yaml "$config" && ! runtime_flagged; then
    echo "install.sh: $kubelet_config is JSON (or YAML in flow style), which install.sh does not edit; kubelet is left as it is. Give kubelet a --config-dir (it merges the *.conf drop-ins there over --config), where install.sh writes one of its own, or set containerRuntimeEndpoint and imageServiceEndpoint to $socket in the file yourself" >&2
    kubelet_unswitched=true
    return 0
  fi
  for key in containerRuntimeEndpoint imageServiceEndpoint; do
    flagged=false
    for rel in "${flag_files[@]}"; do
      if [[ $key == containerRuntimeEndpoint ]]; then
        switch_flag "$rel" --container-runtime-endpoint && flagged=true
      else
        switch_flag "$rel" --image-service-endpoint && flagged=true
      fi
    done
    if $flagged; then
      continue
    elif [[ -n $dir ]]; then
      dropin+=("$key")
    elif [[ $key == imageServiceEndpoint && ${#keys[@]} == 0 && -z "$(key_line "$config" "$key" 2>/dev/null)" ]]; then
      # Unset, kubelet takes the runtime endpoint's flag for images too.
      continue
    else
      keys+=("$key")
    fi
  done
  ((${#dropin[@]} == 0)) || switch_dropin "$dir" "${dropin[@]}"
  if ((${#keys[@]})); then
    if [[ ${keys[0]} == containerRuntimeEndpoint && -f $root$instance_config ]]; then
      switch_line "$instance_config" containerRuntimeEndpoint
    fi
    if [[ -f $config ]]; then
      printf '%s\n' "$kubelet_config" >"$conf_dir/kubelet-config.path"
      touched=$kubelet_touched
      kubelet_touched=false
      for key in "${keys[@]}"; do switch_line "$kubelet_config" "$key"; done
      if $kubelet_touched; then echo "pointed kubelet ($kubelet_config: ${keys[*]}) at $socket"; fi
      if $touched; then kubelet_touched=true; fi
    else
      echo "no $kubelet_config: set kubelet's ${keys[*]} to $socket" >&2
      kubelet_unswitched=true
    fi
  fi
}

# Undoes every row of the record, the last first; sets kubelet_touched when
# a file changed.
restore_kubelet() {
  local kind rel key old new file cur row rows=()
  migrate_backup
  [[ -f $switch_record ]] || return 0
  mapfile -t rows < <(tac "$switch_record")
  for row in "${rows[@]}"; do
    # Not `read`: it would run two tabs around an empty field into one.
    kind="$(cut -f1 <<<"$row")" rel="$(cut -f2 <<<"$row")" key="$(cut -f3 <<<"$row")"
    old="$(cut -f4 <<<"$row")" new="$(cut -f5 <<<"$row")"
    file="$root$rel"
    if [[ ! -f $file ]]; then
      echo "no $rel: nothing to put back there" >&2
      continue
    fi
    case "$kind" in
      line)
        cur="$(key_line "$file" "$key")"
        if [[ -n $cur && "$(line_value "$cur")" == "$socket" ]]; then
          replace_line "$file" "$cur" "$old"
          kubelet_touched=true
        elif [[ $cur != "$old" ]]; then
          echo "left $key in $rel as it is now (${cur:-not set}): it was changed after the install" >&2
        fi ;;
      flag)
        if grep -qF -- "$new" "$file"; then
          replace_word "$file" "$new" "$old"
          kubelet_touched=true
        else
          echo "left $key in $rel as it is now: it was changed after the install" >&2
        fi ;;
      newline)
        if [[ -s $file && -z "$(tail -c1 "$file")" ]]; then
          truncate -s -1 "$file"
          kubelet_touched=true
        fi ;;
      created)
        if grep -q "^# Written by crr-proxy's install.sh" "$file"; then
          rm -f "$file"
          kubelet_touched=true
        else
          echo "left $rel: it was changed after the install" >&2
        fi ;;
    esac
  done
  sweep_kubelet
  if $kubelet_touched; then echo "put back kubelet's endpoints"; fi
  rm -f "$switch_record" "$conf_dir/kubelet-config.path"
}

# The endpoint the record says the key $1 had before the install (empty when
# unknown or unset).
original_endpoint() {
  local flag word
  flag="$(key_flag "$1")"
  word="$(awk -F '\t' -v key="$1" -v flag="$flag" '
    $1 == "line" && $3 == key && $4 != "" { print $4; exit }
    $1 == "flag" && $3 == flag { print $4; exit }' "$switch_record")"
  case "$word" in
    --*) word_value "$word" "$flag" ;;
    ?*) line_value "$word" ;;
  esac
}

# kubelet's default runtime endpoint (its KubeletConfiguration defaults);
# the image endpoint defaults to the runtime's.
default_runtime=unix:///run/containerd/containerd.sock

# The value a file gives the top-level key $2: a YAML line, or in a JSON
# file (or YAML's flow style) a "key": "value" pair.
file_value() {
  local line
  line="$(key_line "$1" "$2")"
  if [[ -n $line ]]; then
    line_value "$line"
  else
    grep -o -m1 -E "\"$2\"[[:space:]]*:[[:space:]]*\"[^\"]*\"" "$1" | sed -E 's/.*:[[:space:]]*"(.*)"$/\1/' || true
  fi
}

# The endpoint kubelet uses now for the key $1, resolved as kubelet does
# (see the top): a flag in the flags files (the last file wins, as the
# last argument does), else the last drop-in of --config-dir that sets it,
# else the --config file, else kubelet's default. Bare paths get unix://.
current_endpoint() {
  local key="$1" flag value="" rel word dir file
  flag="$(key_flag "$key")"
  # The unit's own command line first: the flags files' words come after
  # it on ExecStart.
  while IFS= read -r file; do
    word="$(flag_word "$file" "$flag")"
    [[ -z $word ]] || value="$(word_value "$word" "$flag")"
  done < <(
    unit_files
    for rel in "${flag_files[@]}"; do [[ ! -f $root$rel ]] || printf '%s\n' "$root$rel"; done
  )
  dir="$(config_dir)"
  if [[ -z $value && -n $dir && -d $root$dir ]]; then
    while IFS= read -r file; do
      word="$(file_value "$file" "$key")"
      [[ -z $word ]] || value="$word"
    done < <(find "$root$dir" -maxdepth 1 -name '*.conf' -type f | LC_ALL=C sort)
  fi
  if [[ -z $value && -f $root$kubelet_config ]]; then
    value="$(file_value "$root$kubelet_config" "$key")"
  fi
  if [[ -z $value ]]; then
    if [[ $key == imageServiceEndpoint ]]; then
      value="$(current_endpoint containerRuntimeEndpoint)"
    else
      value=$default_runtime
    fi
  fi
  [[ $value != /* ]] || value="unix://$value"
  printf '%s\n' "$value"
}

key_flag() { [[ $1 == containerRuntimeEndpoint ]] && echo --container-runtime-endpoint || echo --image-service-endpoint; }

# kubeadm moves the endpoint between its files on upgrade (from a flag into
# instance-config.yaml, from there into config.yaml), where no row follows
# it: every place that still names the socket gets the key's original
# endpoint back, or loses the line where there was none.
sweep_kubelet() {
  local key orig rel file cur word
  for key in containerRuntimeEndpoint imageServiceEndpoint; do
    orig="$(original_endpoint "$key")"
    for rel in "$instance_config" "$kubelet_config"; do
      file="$root$rel"
      [[ -f $file ]] || continue
      cur="$(key_line "$file" "$key")"
      [[ -n $cur && "$(line_value "$cur")" == "$socket" ]] || continue
      replace_line "$file" "$cur" "${orig:+$key: $orig}"
      echo "put back $key in $rel (${orig:-unset})"
      kubelet_touched=true
    done
    for rel in "${flag_files[@]}"; do
      file="$root$rel"
      [[ -f $file ]] || continue
      word="$(flag_word "$file" "$(key_flag "$key")")"
      [[ -n $word && $word == *"$socket" ]] || continue
      if [[ -n $orig ]]; then
        replace_word "$file" "$word" "$(key_flag "$key")=$orig"
        echo "put back $(key_flag "$key") in $rel"
        kubelet_touched=true
      else
        echo "$rel still sets $(key_flag "$key") to $socket: set it to the runtime's socket" >&2
      fi
    done
  done
}
