-- How an account logs in: 'password' (password_enc holds the sealed
-- password) or 'oauth2' (password_enc holds the sealed OAuth2 grant as
-- JSON: token endpoint, client id and secret, refresh token, scope).
ALTER TABLE accounts ADD COLUMN auth TEXT NOT NULL DEFAULT 'password';
