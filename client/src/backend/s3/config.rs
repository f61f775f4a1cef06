//! Endpoint, region and credentials of an `s3` engine, from where AWS
//! tools look for them: the environment (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`,
//! `AWS_ENDPOINT_URL`, … — read by `object_store`'s builder, which also
//! knows instance, container and web-identity credentials) and, for what
//! the environment leaves out, the shared files `~/.aws/credentials` and
//! `~/.aws/config` (`AWS_SHARED_CREDENTIALS_FILE`, `AWS_CONFIG_FILE`), in
//! profile `AWS_PROFILE` (or `default`). Secrets read here go to the
//! builder and nowhere else: no `Debug`, no log line, no error carries them.

use std::collections::HashMap;
use std::path::PathBuf;

/// What one profile of the shared files says.
#[derive(Default)]
pub(super) struct Profile {
    pub(super) access_key_id: Option<String>,
    pub(super) secret_access_key: Option<String>,
    pub(super) session_token: Option<String>,
    pub(super) region: Option<String>,
    pub(super) endpoint_url: Option<String>,
}

/// Profile `AWS_PROFILE` (or `default`) of the shared files, the
/// credentials file winning over the config file as in the AWS CLI.
pub(super) fn profile(env: impl Fn(&str) -> Option<String>) -> Profile {
    let home = env("HOME").map(PathBuf::from);
    let file = |var: &str, name: &str| {
        env(var)
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
    };
    let name = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let read = |p: Option<PathBuf>, section: &str| -> HashMap<String, String> {
        p.and_then(|p| std::fs::read_to_string(p).ok())
            .map(|text| section_of(&text, section))
            .unwrap_or_default()
    };
    let creds = read(file("AWS_SHARED_CREDENTIALS_FILE", "credentials"), &name);
    // In the config file a profile other than the default is "profile NAME".
    let config_section = if name == "default" {
        name.clone()
    } else {
        format!("profile {name}")
    };
    let config = read(file("AWS_CONFIG_FILE", "config"), &config_section);
    let get = |k: &str| creds.get(k).or_else(|| config.get(k)).cloned();
    Profile {
        access_key_id: get("aws_access_key_id"),
        secret_access_key: get("aws_secret_access_key"),
        session_token: get("aws_session_token"),
        region: get("region"),
        endpoint_url: get("endpoint_url"),
    }
}

/// The `key = value` pairs of `[section]` in an INI-style AWS file
/// (comments start with `#` or `;`; keys are case-insensitive).
fn section_of(text: &str, section: &str) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
            continue;
        }
        if inside && let Some((k, v)) = line.split_once('=') {
            out.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_comes_from_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let aws = dir.path().join(".aws");
        std::fs::create_dir(&aws).unwrap();
        std::fs::write(
            aws.join("credentials"),
            "[default]\naws_access_key_id = AKD\naws_secret_access_key=SKD\n\n[dev]\n# a comment\nAWS_ACCESS_KEY_ID = AK2\naws_secret_access_key = SK2\naws_session_token = T2\n",
        )
        .unwrap();
        std::fs::write(
            aws.join("config"),
            "[default]\nregion = eu-west-1\n[profile dev]\nregion = us-east-2\nendpoint_url = http://127.0.0.1:3900\n",
        )
        .unwrap();
        let home = dir.path().to_str().unwrap().to_owned();
        let env = |profile: Option<&'static str>| {
            let home = home.clone();
            move |k: &str| match k {
                "HOME" => Some(home.clone()),
                "AWS_PROFILE" => profile.map(String::from),
                _ => None,
            }
        };
        let d = profile(env(None));
        assert_eq!(d.access_key_id.as_deref(), Some("AKD"));
        assert_eq!(d.secret_access_key.as_deref(), Some("SKD"));
        assert_eq!(d.region.as_deref(), Some("eu-west-1"));
        assert_eq!(d.endpoint_url, None);
        let p = profile(env(Some("dev")));
        assert_eq!(p.access_key_id.as_deref(), Some("AK2"));
        assert_eq!(p.session_token.as_deref(), Some("T2"));
        assert_eq!(p.region.as_deref(), Some("us-east-2"));
        assert_eq!(p.endpoint_url.as_deref(), Some("http://127.0.0.1:3900"));
        let none = profile(env(Some("absent")));
        assert!(none.access_key_id.is_none() && none.region.is_none());
    }
}
